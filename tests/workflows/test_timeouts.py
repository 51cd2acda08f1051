"""
timeout_ms on steps and tasks: the attempt fails at its deadline (from its
start on the database clock) with StepTimeoutError (TaskTimeoutError for a
task), raised in the step's thread or its coroutine cancelled; it counts
against max_attempts; the lane is free within the grace even when the
function ignores it; and a late outcome is refused by the attempt's fence.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from pikku_django.errors import StepSupersededError, StepTimeoutError, TaskTimeoutError
from pikku_django.models import WorkflowStep, WorkflowStepAttempt
from pikku_django.tasks.compat import TaskResultStatus, task_finished
from pikku_django.worker import Worker
from pikku_django.workflows import run_workflow, start_workflow, workflow
from pikku_django.workflows.timeouts import abandoned, run_within
from testproject.testing import policy_tasks
from tests.support.children import poll_until
from tests.support.workers import epoch_ms

seen: dict[str, Any] = {}


def slow(mode: str, seconds: float = 5.0) -> str:
    """Runs ``seconds`` in small sleeps: stopped by the timeout, or ignoring it (``ignore``)."""
    seen.setdefault("calls", 0)
    seen["calls"] += 1
    if mode == "first" and seen["calls"] > 1:
        return "quick"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except StepTimeoutError as error:
            seen["raised"] = error
            if mode != "ignore":
                raise
    seen["ended"] = True
    return "late"


async def slow_async() -> str:
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        seen["cancelled"] = True
        raise
    return "late"


@workflow("timeouts.step")
def timed_step(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.step(
        "slow",
        slow,
        input["mode"],
        input.get("seconds", 5.0),
        max_attempts=input.get("max_attempts", 1),
        timeout_ms=1_000,
    )


@workflow("timeouts.async")
def timed_async(ctx: Any, input: Any) -> Any:
    return ctx.step("slow", slow_async, max_attempts=1, timeout_ms=1_000)


def attempts(run_id: Any) -> list[WorkflowStepAttempt]:
    return list(WorkflowStepAttempt.objects.filter(step__run_id=run_id).order_by("attempt"))


def took_ms(row: WorkflowStepAttempt) -> int:
    return epoch_ms(row.failed_at) - epoch_ms(row.running_at)


@override_settings(PIKKU_TIMEOUT_GRACE_MS=300)
class StepTimeoutTests(TransactionTestCase):
    def setUp(self) -> None:
        seen.clear()

    def test_a_step_past_its_timeout_fails_at_about_its_deadline(self) -> None:
        run = run_workflow(start_workflow("timeouts.step", {"mode": "stop"}).pk)
        assert run.status == "failed" and run.error["type"].endswith("StepTimeoutError")
        assert isinstance(seen["raised"], StepTimeoutError) and "ended" not in seen
        (row,) = attempts(run.pk)
        assert row.status == "failed" and 1_000 <= took_ms(row) < 1_800, took_ms(row)

    def test_a_timeout_counts_against_max_attempts(self) -> None:
        run = run_workflow(start_workflow("timeouts.step", {"mode": "first", "max_attempts": 2}).pk)
        assert run.status == "completed" and run.output == "quick"
        first, second = attempts(run.pk)
        assert first.status == "failed" and first.error["type"].endswith("StepTimeoutError")
        assert second.status == "succeeded"

    def test_the_lane_is_free_when_the_function_ignores_it_and_its_late_value_is_refused(self) -> None:
        run = start_workflow("timeouts.step", {"mode": "ignore", "seconds": 2.5})
        other = start_workflow("test.steps", {"steps": 1})
        worker = Worker(holder="w-timeouts", once=True, interval=0.01, concurrency=1)
        began = time.monotonic()
        assert worker.lanes[0].drive_next()
        # Deadline (1 s) plus the grace (0.3 s), within a second.
        assert time.monotonic() - began < 1.3 + 1.0
        run.refresh_from_db()
        assert run.status == "failed" and abandoned() >= 1
        # The lane takes other work while the function still runs.
        assert worker.lanes[0].drive_next()
        other.refresh_from_db()
        assert other.status == "completed" and "ended" not in seen
        step = WorkflowStep.objects.get(run=run)
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(step.pk, "late", attempt=step.attempt)
        poll_until(lambda: seen.get("ended"), 5.0)
        step.refresh_from_db()
        assert (step.status, step.result) == ("failed", None)
        poll_until(lambda: abandoned() == 0 or None, 5.0)

    def test_an_async_step_is_cancelled_at_its_timeout(self) -> None:
        began = time.monotonic()
        run = run_workflow(start_workflow("timeouts.async").pk)
        assert time.monotonic() - began < 3.0
        assert run.status == "failed" and run.error["type"].endswith("StepTimeoutError")
        assert seen.get("cancelled") is True

    def test_no_thread_is_started_without_a_timeout(self) -> None:
        before = threading.active_count()
        run = run_workflow(start_workflow("test.steps", {"steps": 1}).pk)
        assert run.status == "completed" and threading.active_count() <= before + 1


class AbandonedThreadTests(SimpleTestCase):
    @override_settings(PIKKU_TIMEOUT_GRACE_MS=100, PIKKU_TIMEOUT_MAX_ABANDONED=1)
    def test_a_worker_that_keeps_too_many_stuck_threads_stops(self) -> None:
        seen.clear()
        stop = threading.Event()
        with pytest.raises(StepTimeoutError, match="'stuck'"):
            run_within(lambda: slow("ignore", 1.0), 0.2, lambda: StepTimeoutError("stuck", 1, 200), stop=stop)
        assert stop.is_set() and abandoned() >= 1
        poll_until(lambda: seen.get("ended"), 5.0)


def finished(result: Any, timeout: float = 15.0) -> Any:
    worker = Worker(holder="w-task-timeouts", once=True, interval=0.01)

    def done() -> Any:
        worker.lanes[0].drive_next()
        result.refresh()
        return result if result.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None

    return poll_until(done, timeout, interval=0.01)


@override_settings(PIKKU_TIMEOUT_GRACE_MS=300)
class TaskTimeoutTests(TransactionTestCase):
    def test_a_task_past_its_timeout_fails_with_task_timeout_error(self) -> None:
        result = finished(policy_tasks.slow_task.enqueue())
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class_path == f"{TaskTimeoutError.__module__}.TaskTimeoutError"
        (row,) = attempts(result.id)
        assert 1_000 <= took_ms(row) < 1_800, took_ms(row)

    def test_an_async_task_is_cancelled_at_its_timeout(self) -> None:
        policy_tasks.calls.clear()
        result = finished(policy_tasks.slow_async_task.enqueue())
        assert result.status == TaskResultStatus.FAILED
        assert result.errors[0].exception_class_path.endswith("TaskTimeoutError")
        assert policy_tasks.calls.get("cancelled") == 1

    def test_a_task_that_ignores_its_timeout_is_failed_and_reported_once(self) -> None:
        policy_tasks.calls.clear()
        finished_results: list[Any] = []

        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            finished_results.append(task_result)

        task_finished.connect(receive)
        try:
            result = finished(policy_tasks.ignoring_task.enqueue())
        finally:
            task_finished.disconnect(receive)
        assert result.status == TaskResultStatus.FAILED
        assert [r.status for r in finished_results] == [TaskResultStatus.FAILED]
        assert policy_tasks.calls.get("ignored") == 1
        poll_until(lambda: abandoned() == 0 or None, 5.0)
