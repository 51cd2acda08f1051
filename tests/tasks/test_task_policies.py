"""
A task's policy options: through ``@task(**kwargs)`` (Django 6.1, and the
backport) and through ``pikku_django.tasks.options``; the backend's OPTIONS
as defaults; bad values and unknown names.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from pikku_django.errors import PikkuError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.policy import fixed
from pikku_django.tasks import PikkuTask, options
from pikku_django.tasks.compat import Task, TaskResultStatus, task_backends
from pikku_django.tasks.options import _UNKNOWN, check_task_options, make_task
from pikku_django.worker import Worker
from testproject.testing import policy_tasks, tasks
from tests.support.children import poll_until
from tests.support.workers import epoch_ms


def finished(result: Any, timeout: float = 15.0) -> Any:
    """Lanes drive the task (each pass runs what is due) until its result is final."""
    worker = Worker(holder="w-task-policies", once=True, interval=0.01)

    def done() -> Any:
        worker.lanes[0].drive_next()
        result.refresh()
        return result if result.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None

    return poll_until(done, timeout, interval=0.01)


def rows(result: Any) -> list[WorkflowStepAttempt]:
    return list(WorkflowStepAttempt.objects.filter(step__run_id=result.id).order_by("attempt"))


class TaskPolicyTests(TransactionTestCase):
    def setUp(self) -> None:
        policy_tasks.calls.clear()

    def test_options_through_task_kwargs_retry_with_backoff(self) -> None:
        result = finished(policy_tasks.through_task.enqueue("kw", 2))
        assert result.status == TaskResultStatus.SUCCESSFUL and policy_tasks.calls["kw"] == 3
        attempts = rows(result)
        for before, after in zip(attempts, attempts[1:], strict=False):
            gap = epoch_ms(after.running_at) - epoch_ms(before.failed_at)
            assert 300 <= gap <= 1_300, gap
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.retries, step.worker_losses) == (2, 2)

    def test_max_attempts_through_task_kwargs(self) -> None:
        result = finished(policy_tasks.through_task.enqueue("spent", 9))
        assert result.status == TaskResultStatus.FAILED and policy_tasks.calls["spent"] == 3
        assert len(result.errors) == 3

    def test_an_error_outside_retry_on_fails_the_task_at_once(self) -> None:
        result = finished(policy_tasks.through_task.enqueue("perm", 9, "permanent"))
        assert result.status == TaskResultStatus.FAILED and policy_tasks.calls["perm"] == 1
        assert result.errors[0].exception_class_path.endswith("Permanent")

    def test_a_non_retryable_error_fails_the_task_at_once(self) -> None:
        result = finished(policy_tasks.through_options.enqueue("nr", 9, "final"))
        assert result.status == TaskResultStatus.FAILED and policy_tasks.calls["nr"] == 1

    def test_options_through_the_decorator(self) -> None:
        result = finished(policy_tasks.through_options.enqueue("dec", 3))
        assert result.status == TaskResultStatus.SUCCESSFUL and policy_tasks.calls["dec"] == 4
        attempts = rows(result)
        for before, after, delay in zip(attempts, attempts[1:], (200, 400, 800), strict=False):
            gap = epoch_ms(after.running_at) - epoch_ms(before.failed_at)
            assert delay <= gap <= delay + 1_000, (delay, gap)

    def test_a_backoff_is_the_runs_wake_at(self) -> None:
        result = policy_tasks.long_backoff.enqueue("long")
        worker = Worker(holder="w-task-policies", once=True, interval=0.01)
        assert worker.lanes[0].drive_next()
        run = WorkflowRun.objects.get(pk=result.id)
        assert run.status == "running" and run.wake_at > Lease.objects.db_now_ms() + 55_000
        # Nothing is due: the lane takes nothing, and the task is not run again.
        assert not worker.lanes[0].drive_next()
        assert policy_tasks.calls["long"] == 1
        result.refresh()
        assert result.status == TaskResultStatus.READY or result.status == TaskResultStatus.RUNNING

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "pikku_django.tasks.PikkuTaskBackend",
                "OPTIONS": {"max_attempts": 2, "backoff": 100},
            }
        }
    )
    def test_the_backends_options_are_defaults(self) -> None:
        backend = task_backends["default"]
        assert backend.options_error is None
        plain = make_task(func=policy_tasks._fail, backend="default")
        retries, losses, policy = backend._policy(plain)
        assert (retries, losses) == (1, 2) and policy is not None and policy.backoff == fixed(100)
        own = options(max_attempts=5)(plain)
        assert backend._policy(own)[:2] == (4, 2)


class TaskOptionValueTests(SimpleTestCase):
    def test_bad_values_raise_naming_the_argument(self) -> None:
        with pytest.raises(ValueError, match="max_attempts") as caught:
            options(max_attempts=0)
        assert isinstance(caught.value, PikkuError)
        with pytest.raises(ValueError, match="backoff"):
            make_task(func=policy_tasks._fail, backend="default", backoff="soon")
        with pytest.raises(ValueError, match="timeout_ms"):
            options(timeout_ms=-1)

    def test_unknown_option_names_are_a_system_check_error_naming_the_task(self) -> None:
        try:
            made = make_task(func=policy_tasks._fail, backend="default", max_atempts=3)
            assert isinstance(made, PikkuTask)
            (error,) = check_task_options()
            assert isinstance(error, Error) and error.id == "pikku_django.E040"
            assert "testproject.testing.policy_tasks._fail" in error.msg and "max_atempts" in error.msg
            assert any(message.id == "pikku_django.E040" for message in task_backends["default"].check())
        finally:
            _UNKNOWN.clear()
        assert not check_task_options()

    def test_options_turn_a_plain_task_into_one_with_options(self) -> None:
        plain = Task(func=policy_tasks._fail, backend="default")
        made = options(max_attempts=2, timeout_ms=1_000)(plain)
        assert isinstance(made, PikkuTask) and made.option_dict == {"max_attempts": 2, "timeout_ms": 1_000}
        assert made.using(priority=5).option_dict == made.option_dict
        with pytest.raises(TypeError):
            options(max_attempts=2)(policy_tasks._fail)  # type: ignore[arg-type]


class WorkerInsertedStepTests(TransactionTestCase):
    """
    ``enqueue`` outside a transaction dies between its two INSERTs: the run
    is stored, its step is not, and the worker that takes the run inserts the
    step itself, with the same budget the backend gives (issue 30).
    """

    def without_step(self, result: Any, *, stored_budget: bool = True) -> Any:
        """``result``'s run as that crash leaves it (``stored_budget`` False: stored by an older enqueue)."""
        WorkflowStep.objects.filter(run_id=result.id).delete()
        if not stored_budget:
            run = WorkflowRun.objects.get(pk=result.id)
            run.input.pop("worker_losses")
            run.save(update_fields=["input"])
        return result

    def test_the_step_has_its_backends_retries_and_worker_losses(self) -> None:
        cases = [
            (tasks.add, (1, 2), {}, (0, 2)),  # the default backend
            (tasks.note_without_losses, ("n",), {}, (1, 0)),  # OPTIONS retries 1, worker_losses 0
            (tasks.flaky, (), {"succeed_on": 1}, (2, 2)),  # OPTIONS retries 2
        ]
        for task, args, kwargs, budget in cases:
            for stored_budget in (True, False):
                result = self.without_step(task.enqueue(*args, **kwargs), stored_budget=stored_budget)
                assert finished(result).status == TaskResultStatus.SUCCESSFUL, result.errors
                step = WorkflowStep.objects.get(run_id=result.id)
                assert (step.retries, step.worker_losses) == budget, (task, stored_budget)

    def test_a_task_with_its_own_policy_keeps_it(self) -> None:
        result = self.without_step(policy_tasks.through_task.enqueue("inserted", 1))
        assert finished(result).status == TaskResultStatus.SUCCESSFUL
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.retries, step.worker_losses) == (2, 2)
