"""
Readers of a run: ``wait_for_result``, ``get_event`` and ``read_stream``
(and their async twins) wait on the database clock, see each item once and
in order whenever they start, and change nothing when they time out.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError, PikkuError, ResultTimeoutError
from pikku_django.models import WorkflowRun
from pikku_django.workflows import (
    aget_event,
    aread_stream,
    await_result,
    get_event,
    read_stream,
    run_workflow,
    send_signal,
    start_workflow,
    wait_for_result,
)
from pikku_django.workflows.waiting import POLL_MS, Deadline

T = TypeVar("T")


def in_thread(fn: Any, *args: Any) -> threading.Thread:
    """Run ``fn(*args)`` on a thread of its own (its own connection, closed at the end)."""

    def body() -> None:
        try:
            fn(*args)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def arun(awaitable: Awaitable[T]) -> T:
    """Run a coroutine to its end, then close the connection its sync calls used."""

    async def body() -> T:
        try:
            return await awaitable
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(body())


def finish(run_id: Any) -> None:
    send_signal(run_id, "go")
    run_workflow(run_id)


def suspended_run(**input: Any) -> WorkflowRun:
    run = start_workflow("test.emits", {"before": 3, "after": 2, **input})
    return run_workflow(run.pk)


class WaitForResultTests(TransactionTestCase):
    def test_a_finished_run_is_returned_at_once(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        found = wait_for_result(run.pk, timeout_ms=0)
        assert (found.pk, found.status, found.output) == (run.pk, "completed", {"offsets": [0, 1, 2, 3, 4]})

    def test_a_waiter_is_woken_by_the_run_s_end(self) -> None:
        run = suspended_run()
        thread = in_thread(lambda: (time.sleep(0.2), finish(run.pk)))
        found = wait_for_result(run.pk, timeout_ms=20_000)
        thread.join()
        assert found.status == "completed"

    def test_a_waiter_that_times_out_changes_nothing(self) -> None:
        run = suspended_run()
        before = WorkflowRun.objects.get(pk=run.pk)
        with pytest.raises(ResultTimeoutError) as caught:
            wait_for_result(run.pk, timeout_ms=150)
        assert caught.value.run_id == run.pk
        assert isinstance(caught.value, PikkuError)
        after = WorkflowRun.objects.get(pk=run.pk)
        assert (after.status, after.updated_at, after.wake_at) == (
            before.status,
            before.updated_at,
            before.wake_at,
        )
        # The run goes on to complete.
        finish(run.pk)
        assert wait_for_result(run.pk, timeout_ms=0).status == "completed"

    def test_an_unknown_run_or_a_bad_timeout_is_refused(self) -> None:
        with pytest.raises(InvalidArgumentError, match="run_id"):
            wait_for_result("00000000-0000-0000-0000-000000000000", timeout_ms=0)
        with pytest.raises(InvalidArgumentError, match="run_id"):
            wait_for_result("not a uuid", timeout_ms=0)
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            wait_for_result("00000000-0000-0000-0000-000000000000", timeout_ms=-1)

    def test_the_async_twin_returns_the_run_and_times_out_alike(self) -> None:
        run = suspended_run()
        with pytest.raises(ResultTimeoutError):
            arun(await_result(run.pk, timeout_ms=100))
        thread = in_thread(lambda: (time.sleep(0.2), finish(run.pk)))
        found = arun(await_result(run.pk, timeout_ms=20_000))
        thread.join()
        assert found.status == "completed"

    def test_a_cancelled_async_waiter_changes_nothing(self) -> None:
        run = suspended_run()
        before = WorkflowRun.objects.get(pk=run.pk)

        async def cancel_soon() -> None:
            task = asyncio.ensure_future(await_result(run.pk, timeout_ms=20_000))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        arun(cancel_soon())
        after = WorkflowRun.objects.get(pk=run.pk)
        assert (after.status, after.updated_at) == (before.status, before.updated_at)


class GetEventTests(TransactionTestCase):
    def test_the_last_value_or_none(self) -> None:
        run = suspended_run()
        assert get_event(run.pk, "status") == {"done": 3}
        assert get_event(run.pk, "never") is None
        assert arun(aget_event(run.pk, "status")) == {"done": 3}

    def test_a_wait_for_the_first_value_ends_when_it_is_set(self) -> None:
        run = start_workflow("test.emits", {"wait": False})
        thread = in_thread(lambda: (time.sleep(0.2), run_workflow(run.pk)))
        assert get_event(run.pk, "status", timeout_ms=20_000) is not None
        thread.join()

    def test_past_its_deadline_it_returns_none_and_a_finished_run_answers_at_once(self) -> None:
        run = suspended_run()
        started = time.monotonic()
        assert get_event(run.pk, "never", timeout_ms=200) is None
        assert time.monotonic() - started >= 0.15
        assert arun(aget_event(run.pk, "never", timeout_ms=100)) is None
        finish(run.pk)
        started = time.monotonic()
        assert get_event(run.pk, "never", timeout_ms=20_000) is None
        assert time.monotonic() - started < 5

    def test_bad_keys_are_refused(self) -> None:
        run = suspended_run()
        for bad in ("", "k" * 256, None):
            with pytest.raises(InvalidArgumentError, match="key"):
                get_event(run.pk, bad)  # type: ignore[arg-type]


class ReadStreamTests(TransactionTestCase):
    def test_a_finished_run_s_stream_is_read_to_its_end(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        assert list(read_stream(run.pk, "log", timeout_ms=20_000)) == [(i, {"i": i}) for i in range(5)]
        assert list(read_stream(run.pk, "log", offset=3)) == [(3, {"i": 3}), (4, {"i": 4})]
        assert list(read_stream(run.pk, "log", offset=9)) == []
        assert list(read_stream(run.pk, "other")) == []

    def test_readers_that_start_before_during_and_after_get_each_item_once_in_order(self) -> None:
        run = start_workflow("test.publish_many", {"count": 150, "every": 10})
        seen: dict[str, list[int]] = {"before": [], "during": []}

        def read(name: str) -> None:
            seen[name] = [item for _, item in read_stream(run.pk, "items", timeout_ms=30_000)]

        before = in_thread(read, "before")
        runner = in_thread(run_workflow, run.pk)
        while not WorkflowRun.objects.get(pk=run.pk).stream_items.exists():
            time.sleep(0.01)
        during = in_thread(read, "during")
        runner.join()
        before.join()
        during.join()
        assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
        after = [item for _, item in read_stream(run.pk, "items")]
        assert seen["before"] == seen["during"] == after == list(range(150))

    def test_a_wait_for_the_next_item_ends_quietly_at_its_timeout(self) -> None:
        run = suspended_run()
        started = time.monotonic()
        assert [offset for offset, _ in read_stream(run.pk, "log", timeout_ms=200)] == [0, 1, 2]
        assert time.monotonic() - started >= 0.15

    def test_the_async_twin_reads_alike(self) -> None:
        run = suspended_run()

        async def read() -> list[int]:
            return [offset async for offset, _ in aread_stream(run.pk, "log", offset=1, timeout_ms=100)]

        assert arun(read()) == [1, 2]

        async def unknown() -> None:
            async for _ in aread_stream("00000000-0000-0000-0000-000000000000", "log"):
                pass

        with pytest.raises(InvalidArgumentError, match="run_id"):
            arun(unknown())

    def test_bad_arguments_are_refused(self) -> None:
        run = suspended_run()
        with pytest.raises(InvalidArgumentError, match="stream"):
            read_stream(run.pk, "")
        with pytest.raises(InvalidArgumentError, match="offset"):
            read_stream(run.pk, "log", offset=-1)
        with pytest.raises(InvalidArgumentError, match="stream"):
            aread_stream(run.pk, "s" * 256)


def test_a_deadline_is_set_by_the_first_look_and_polls_at_most_every_poll_ms() -> None:
    deadline = Deadline(250)
    assert deadline.pause_ms(1_000) == POLL_MS
    assert deadline.pause_ms(1_200) == 50
    assert deadline.pause_ms(1_250) is None
    deadline.restart()
    assert deadline.pause_ms(5_000) == POLL_MS


class NotifyTests(TransactionTestCase):
    def test_on_postgresql_a_waiter_hears_the_completing_commit(self) -> None:
        """Within 50 ms of the commit at the median (elsewhere within the 100 ms poll and a look)."""
        bound = 0.05 if connections["default"].vendor == "postgresql" else 0.3
        lags = []
        for _ in range(5):
            run = suspended_run()
            send_signal(run.pk, "go")
            returned: list[float] = []

            def wait(run_id: Any, returned: list[float]) -> None:
                wait_for_result(run_id, timeout_ms=20_000)
                returned.append(time.monotonic())

            waiter = in_thread(wait, run.pk, returned)
            # The waiter is waiting (past its first look) before the run ends.
            time.sleep(0.3)
            run_workflow(run.pk)
            committed = time.monotonic()
            waiter.join()
            lags.append(returned[0] - committed)
        lags.sort()
        assert lags[len(lags) // 2] < bound, lags
