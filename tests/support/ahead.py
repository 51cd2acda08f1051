"""
Runs taken ahead, for the tests of a lane that takes several runs in one
commit: a long run held in hand on a thread of its own while the test looks
at the runs taken with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connections
from django.test import TransactionTestCase, override_settings

from pikku_django.models import WorkflowStep, WorkflowStepAttempt
from pikku_django.worker import Worker
from testproject.testing import tasks
from tests.support.children import poll_until

#: The run and step leases of the tests of a long run: short, so that they
#: would lapse many times over while the long run waits.
SHORT_LEASE_MS = 600


def attempts_of(result_id: str) -> list[tuple[int, str]]:
    """A task's attempts, as (number, status), in order."""
    rows = WorkflowStepAttempt.objects.filter(step__run_id=result_id).order_by("attempt")
    return list(rows.values_list("attempt", "status"))


class LongRunInHand(TransactionTestCase):
    """A worker's lane busy with a long run while the test looks at the runs taken with it."""

    @contextmanager
    def long_run_in_hand(
        self, run: Callable[[], object], then: Callable[[], None] | None = None
    ) -> Iterator[Any]:
        """
        ``run()`` (a worker's) on a thread of its own, with a task of priority
        2 that waits for the test's go-ahead: yields that task's result once
        its step runs; on exit, lets it end, calls ``then()`` and waits for
        the thread.
        """
        go = Path(self.id().replace(".", "_") + ".go")
        self.addCleanup(go.unlink, missing_ok=True)
        long = tasks.wait_for_file.using(priority=2).enqueue(str(go.resolve()))

        def target() -> None:
            try:
                run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        try:
            poll_until(
                lambda: WorkflowStep.objects.filter(run_id=long.id, status="running").exists(), timeout=30
            )
            yield long
        finally:
            go.touch()
            if then is not None:
                then()
            thread.join(60)
        assert not thread.is_alive()

    def batch_of_short_passes(self, worker: Worker) -> Callable[[], object]:
        def run() -> object:
            # The window is as it is: a run taken ahead whose pass starts
            # after it is checked against the run's state again.
            with override_settings(PIKKU_TAKE_AHEAD_BELOW_MS=3_600_000):
                return worker.run_batch()

        return run
