"""
What a lone task costs: the durable commits of one no-op task through a
worker pass, counted on the worker's connection.

A commit is a COMMIT that ends a transaction which wrote (Django's own, or
one opened by ``START TRANSACTION``/``BEGIN`` and sent as statements), or a
writing statement run in autocommit, which is a transaction of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import Lease, WorkflowStepAttempt
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker
from testproject.testing import tasks

#: The target of issue 14: a lone no-op task through an idle worker.
LONE_TASK_COMMITS = 3

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
_BEGIN = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
_END = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
#: A write that changes nothing (SQLite's write-lock probe) is no commit of its own.
_NO_ROWS = re.compile(r"WHERE\s+0\s*=\s*1", re.IGNORECASE)


class CommitCounter:
    """Counts durable commits on ``connection`` (see the module docstring)."""

    def __init__(self) -> None:
        self.commits = 0
        self.statements: list[str] = []
        self._explicit = False
        self._wrote = False

    def report(self) -> str:
        """The count and the statements sent, each cut short, for a failure's message."""
        shown = "\n".join(" ".join(text.split())[:100] for text in self.statements)
        return f"{self.commits} commits:\n{shown}"

    def _in_transaction(self) -> bool:
        return self._explicit or connection.in_atomic_block or not connection.get_autocommit()

    def _statement(self, sql: str) -> None:
        if _BEGIN.match(sql):
            self._explicit, self._wrote = True, False
        elif _END.match(sql):
            if sql.lstrip().upper().startswith("COMMIT") and self._wrote:
                self.commits += 1
            self._explicit = self._wrote = False
        elif _WRITES.search(sql) and not _NO_ROWS.search(sql):
            if self._in_transaction():
                self._wrote = True
            else:
                self.commits += 1

    def execute(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        text = sql if isinstance(sql, str) else str(sql)
        self.statements.append(text)
        # MySQL/MariaDB send a transaction's statements in one round trip.
        for part in text.split(";\n"):
            if part.strip():
                self._statement(part)
        return execute(sql, params, many, context)

    def commit(self, real: Callable[[], None]) -> None:
        # Django's atomic() commits through the connection, not a statement.
        if self._wrote:
            self.commits += 1
        self._explicit = self._wrote = False
        real()


@contextmanager
def counting_commits() -> Iterator[CommitCounter]:
    counter = CommitCounter()
    real_commit = connection.commit
    with (
        connection.execute_wrapper(counter.execute),
        mock.patch.object(connection, "commit", lambda: counter.commit(real_commit)),
    ):
        yield counter


class LoneTaskCommitTests(TransactionTestCase):
    def test_a_lone_no_op_task_costs_three_durable_commits(self) -> None:
        result = tasks.add.enqueue(2, 3)
        worker = Worker(holder="w-commits", once=True, interval=0.01)
        with counting_commits() as counter:
            assert worker.drive_next(worker.lane_holder(0)) is True
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert counter.commits == LONE_TASK_COMMITS, counter.report()
        # Every guarantee's trace is there: the attempt's history, the run lease released.
        attempt = WorkflowStepAttempt.objects.get(step__run_id=result.id)
        assert (attempt.attempt, attempt.status, attempt.holder) == (1, "succeeded", "w-commits")
        assert Lease.objects.current(f"workflow-run:{result.id}") is None
        assert Lease.objects.get(key=f"workflow-run:{result.id}").holder == "w-commits"
