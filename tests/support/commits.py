"""
Durable commits counted on the test's connection: what a worker pass costs.

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

#: Issue 14: a lone task through an idle worker, successful or failed: the
#: take with the step's claim, then the outcome with the run's end and the release.
LONE_TASK_COMMITS = 2

#: The reads of a lone task's pass: the look for due runs. The take returns
#: the run, its claim the step, the outcome the end ``task_finished``
#: reports (on MySQL/MariaDB, which have no RETURNING, each is read in the
#: write's own round trip).
LONE_TASK_READS = {"postgresql": 1, "sqlite": 1, "mysql": 1}

WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
BEGIN = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|RELEASE)\b", re.IGNORECASE)
END = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
#: A write that changes nothing (SQLite's write-lock probe) is no commit of its own.
NO_ROWS = re.compile(r"WHERE\s+0\s*=\s*1", re.IGNORECASE)


class CommitCounter:
    """Counts durable commits on ``connection`` (see this module's docstring)."""

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
        if BEGIN.match(sql):
            self._explicit, self._wrote = True, False
        elif END.match(sql):
            if sql.lstrip().upper().startswith("COMMIT") and self._wrote:
                self.commits += 1
            self._explicit = self._wrote = False
        elif WRITES.search(sql) and not NO_ROWS.search(sql):
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
