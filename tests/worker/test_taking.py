"""
The lanes of one worker leave each other the due runs they are taking
(``pikku_django.worker.taking``): woken together, they read much the same due list,
and a lane that tried runs another lane was taking would lose each of those
takes in the database, a round trip (on MySQL/MariaDB a batch) apiece.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

from django.db import connection, connections
from django.test import SimpleTestCase, TransactionTestCase

from pikku_django.models import WorkflowRun
from pikku_django.store import takes
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker
from pikku_django.worker.taking import Taking
from testproject.testing import tasks
from tests.support.children import poll_until


class TakingTests(SimpleTestCase):
    def test_a_look_leaves_out_what_another_lane_is_taking_or_took_after_it_began(self) -> None:
        taking = Taking()
        due = [("a", 1), ("b", 2), ("c", 3)]
        before = time.monotonic()
        assert taking.start(["a", "b", "c"], before, keep=2) == ["a", "b", "c"]
        # Another lane's look, while "a" and "b" are being taken ("c" is a fallback).
        assert taking.busy() == 2
        assert taking.claim(due, time.monotonic()) == [("c", 3)]
        assert taking.start(["b", "c"], time.monotonic(), keep=1) == ["c"]
        taking.end(["a", "b"], taken=["a"])
        # "a" was taken after the look that began at ``before``: that look
        # may have read it before the take committed. A look begun since has
        # not seen it due, and "b" (not taken) is free again.
        assert taking.claim(due, before) == [("b", 2)]
        assert taking.claim(due, time.monotonic()) == [("a", 1), ("b", 2)]
        assert taking.start(["a", "b"], before, keep=1) == ["b"]
        taking.end(["c", "b"], taken=[])
        assert taking.busy() == 0


class LanesTakingTests(TransactionTestCase):
    def test_a_run_another_lane_is_taking_is_left_to_it(self) -> None:
        first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
        worker = Worker(holder="w-taking", concurrency=2, interval=0.01)
        worker.taking.start([_pk(first.id)], time.monotonic(), keep=1)
        sent: list[Any] = []

        def record(execute: Callable[..., Any], sql: str, params: Any, *args: Any) -> Any:
            sent.append(params)
            return execute(sql, params, *args)

        with connection.execute_wrapper(record):
            assert worker.lanes[1].drive_next()
        second.refresh()
        assert second.status == TaskResultStatus.SUCCESSFUL
        first.refresh()
        assert first.status == TaskResultStatus.READY
        # Not one statement named the run the other lane has (its parameters
        # are where a statement names a run; the one driven is named there).
        assert [params for params in sent if _names(params, second.id)]
        assert not [params for params in sent if _names(params, first.id)]
        worker.taking.end([_pk(first.id)], taken=[])
        assert worker.lanes[1].drive_next()
        first.refresh()
        assert (first.status, first.return_value) == (TaskResultStatus.SUCCESSFUL, 2)

    def test_lanes_woken_together_lose_no_take_to_each_other(self) -> None:
        results = [tasks.add.enqueue(i, 1) for i in range(60)]
        worker = Worker(holder="w-together", concurrency=4, interval=60)
        lost: list[Any] = []
        real = takes._take_within

        def counted(*args: Any, **kwargs: Any) -> takes.Take:
            took = real(*args, **kwargs)
            if not took.taken:
                lost.append(took.run_id)
            return took

        def run() -> None:
            try:
                worker.run()
            finally:
                connections.close_all()

        with mock.patch.object(takes, "_take_within", counted):
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                running = WorkflowRun.objects.filter(status="running")
                poll_until(lambda: not running.exists(), timeout=60, interval=0.05)
            finally:
                worker.stop()
                thread.join(30)
        assert not thread.is_alive()
        assert WorkflowRun.objects.filter(status="completed").count() == len(results)
        # Every take tried a run no other lane of the process was taking.
        assert lost == []


def _pk(run_id: str) -> Any:
    return WorkflowRun._meta.pk.to_python(run_id)


def _names(params: Any, run_id: str) -> bool:
    """Does a statement's ``params`` (a dict or a sequence) hold ``run_id``, in any of its database forms?"""
    pk = _pk(run_id)
    values = params.values() if isinstance(params, dict) else params or ()
    return any(value in (pk, str(pk), pk.hex) for value in values)
