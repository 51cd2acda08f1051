"""``PikkuTaskBackend.wait`` and ``set_progress``: a task's result waited for, its progress an event."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.test import TransactionTestCase

from pikku_django.errors import PikkuError, ResultTimeoutError
from pikku_django.tasks import set_progress
from pikku_django.tasks.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from pikku_django.worker import Worker
from pikku_django.workflows import get_event
from testproject.testing import tasks


def drain() -> int:
    return Worker(holder="w-1", once=True, interval=0.01).run()


class WaitTests(TransactionTestCase):
    def test_wait_returns_the_finished_result_or_times_out_naming_it(self) -> None:
        result = tasks.counts_up.enqueue(3)
        backend: Any = task_backends["default"]
        with pytest.raises(ResultTimeoutError) as caught:
            backend.wait(result.id, timeout_ms=100)
        assert str(caught.value.run_id) == result.id
        assert get_event(result.id, "progress") is None

        def work() -> None:
            try:
                time.sleep(0.1)
                drain()
            finally:
                connections.close_all()

        worker = threading.Thread(target=work)
        worker.start()
        finished = backend.wait(result.id, timeout_ms=30_000)
        worker.join()
        assert finished.status == TaskResultStatus.SUCCESSFUL
        assert finished.return_value == 3
        assert get_event(result.id, "progress") == {"done": 3, "of": 3}

    def test_an_unknown_result_is_refused(self) -> None:
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].wait("00000000-0000-0000-0000-000000000000", timeout_ms=0)  # type: ignore[attr-defined]


def test_set_progress_outside_a_task_is_an_error() -> None:
    with pytest.raises(PikkuError, match="inside the task"):
        set_progress(1)
