"""
``PikkuTaskBackend`` for Django's Tasks framework (``django.tasks`` on Django
6, the ``django_tasks`` backport on 5.2): enqueue, results, retries, signals,
refusals, transactions. Worker processes are in ``test_task_processes.py``.
"""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.test import TransactionTestCase

from pikku_django.errors import (
    InvalidArgumentError,
    PikkuConfigurationError,
    StepLeaseExpiredError,
    TaskPathError,
)
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.tasks import PikkuTaskBackend
from pikku_django.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from pikku_django.tasks.results import TASK_WORKFLOW, resolve_task
from pikku_django.worker import Worker
from testproject.testing import tasks
from tests.support.factories import lapse_step


def drain(holder: str = "w-1", **kwargs: Any) -> int:
    """One in-process ``pikku_worker --once``."""
    return Worker(holder=holder, once=True, interval=0.01, **kwargs).run()


def committed_status(run_id: Any) -> str:
    """The run's status as another connection reads it: what has committed."""
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        table = other.ops.quote_name(WorkflowRun._meta.db_table)
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT status FROM {table} WHERE id = %s",  # noqa: S608  (a table name, no values)
                [WorkflowRun._meta.pk.get_db_prep_value(uuid.UUID(str(run_id)), other)],
            )
            (status,) = cursor.fetchone()
        return str(status)
    finally:
        other.close()


class Signals:
    """
    Collects the Tasks framework's signals: (name, status, attempts) each,
    and at each ``task_finished`` the exception active and the run's
    status as committed.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.active_errors: list[BaseException | None] = []
        self.committed: list[str] = []
        self.finished: list[Any] = []
        self.started: list[Any] = []

    def __enter__(self) -> Signals:
        for signal in (task_enqueued, task_started, task_finished):
            signal.connect(self.receive, dispatch_uid=f"test-{id(signal)}")
        return self

    def __exit__(self, *exc: object) -> None:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(dispatch_uid=f"test-{id(signal)}")

    def receive(self, sender: Any, signal: Any, task_result: Any, **kwargs: Any) -> None:
        import sys

        assert sender is PikkuTaskBackend
        name = {id(task_enqueued): "enqueued", id(task_started): "started", id(task_finished): "finished"}
        self.seen.append((name[id(signal)], str(task_result.status), task_result.attempts))
        if signal is task_started:
            self.started.append(task_result)
        if signal is task_finished:
            self.active_errors.append(sys.exc_info()[1])
            self.committed.append(committed_status(task_result.id))
            self.finished.append(task_result)


class EnqueueTests(TransactionTestCase):
    def test_a_coroutine_task_runs_in_a_lane(self) -> None:
        result = tasks.add_later.enqueue(2, 3)
        assert result.status == TaskResultStatus.READY
        assert drain() == 1
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)

    def test_backend_and_features(self) -> None:
        backend = task_backends["default"]
        assert isinstance(backend, PikkuTaskBackend)
        assert backend.supports_defer and backend.supports_priority and backend.supports_get_result
        assert (backend.retries, backend.lease_ms) == (0, None)
        assert task_backends["retrying"].retries == 2

    def test_enqueue_stores_one_ready_run_and_sends_task_enqueued(self) -> None:
        with Signals() as signals:
            result = tasks.add.enqueue(2, 3)
        assert signals.seen == [("enqueued", "READY", 0)]
        assert result.status == TaskResultStatus.READY
        assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "default")
        run = WorkflowRun.objects.get(pk=result.id)
        assert (run.workflow, run.queue, run.priority, run.status) == (TASK_WORKFLOW, "default", 0, "running")
        assert run.input["task"] == "testproject.testing.tasks.add"
        fetched = task_backends["default"].get_result(result.id)
        assert fetched.status == TaskResultStatus.READY
        assert (fetched.attempts, fetched.worker_ids, fetched.errors) == (0, [], [])
        assert fetched.enqueued_at == run.created_at
        assert fetched.started_at is None and fetched.finished_at is None
        assert tasks.add.get_result(result.id).id == result.id

    def test_enqueue_to_worker_to_successful(self) -> None:
        result = tasks.add.enqueue(2, 3)
        with Signals() as signals:
            assert drain("w-1") == 1
        assert signals.seen == [("started", "RUNNING", 1), ("finished", "SUCCESSFUL", 1)]
        # Reported done only once its outcome has committed (issue 14).
        assert signals.committed == ["completed"]
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 5
        assert (result.attempts, result.worker_ids, result.errors) == (1, ["w-1"], [])
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert result.last_attempted_at == result.started_at
        assert WorkflowStep.objects.get(run_id=result.id).rpc_name == "testproject.testing.tasks.add"

    def test_the_signals_report_the_start_and_end_as_stored(self) -> None:
        # The first attempt's start is built from the step its claim read
        # back, and the end from what the outcome's statement stored: the
        # same moments, to the microsecond, as the stored result gives.
        results = [tasks.add.enqueue(1, 2), tasks.flaky.enqueue(succeed_on=2)]
        with Signals() as signals:
            drain("w-3")
        stored = [task_backends["default"].get_result(r.id) for r in results]
        first = next(r for r in signals.started if r.id == results[0].id)
        assert (first.started_at, first.last_attempted_at) == (stored[0].started_at,) * 2
        assert (first.worker_ids, first.errors, first.attempts) == (["w-3"], [], 1)
        again = [r for r in signals.started if r.id == results[1].id]
        assert [r.attempts for r in again] == [1, 2]
        assert again[1].started_at == stored[1].started_at
        assert again[1].last_attempted_at == stored[1].last_attempted_at
        assert [e.exception_class_path for e in again[1].errors] == ["builtins.RuntimeError"]
        ends = {r.id: r.finished_at for r in signals.finished}
        assert ends == {r.id: r.finished_at for r in stored}
        assert all(r.finished_at is not None for r in stored)

    def test_raising_task_is_failed_with_its_error_class_and_traceback(self) -> None:
        result = tasks.explode.enqueue("boom")
        with Signals() as signals:
            drain()
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        ((error,),) = [result.errors]
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "Traceback" in error.traceback and "ValueError: boom" in error.traceback
        assert "def explode" in error.traceback or "explode" in error.traceback
        assert result.worker_ids == ["w-1"]
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
        # FAILED is sent once the attempt's failure and the run's have
        # committed (one commit, issue 14): a result is reported done only
        # once its outcome has committed. It is sent with the task's own
        # exception active, for receivers that log it (Django's own uses
        # logger.exception).
        assert signals.seen == [("started", "RUNNING", 1), ("finished", "FAILED", 1)]
        assert signals.committed == ["failed"]
        assert isinstance(signals.active_errors[0], ValueError)
        assert signals.finished[0].finished_at == result.finished_at
        assert [e.exception_class_path for e in signals.finished[0].errors] == ["builtins.ValueError"]

    def test_retries_make_attempts_retries_plus_one_with_one_worker_id_each(self) -> None:
        failing = tasks.flaky.enqueue(succeed_on=10)
        succeeding = tasks.flaky.enqueue(succeed_on=3)
        with Signals() as signals:
            drain("w-2")
        failing.refresh()
        succeeding.refresh()
        assert failing.status == TaskResultStatus.FAILED
        assert (failing.attempts, failing.worker_ids) == (3, ["w-2"] * 3)
        assert [e.exception_class_path for e in failing.errors] == ["builtins.RuntimeError"] * 3
        assert succeeding.status == TaskResultStatus.SUCCESSFUL
        # The context's attempt counts from 1.
        assert succeeding.return_value == {"attempt": 3}
        assert (succeeding.attempts, len(succeeding.errors)) == (3, 2)
        # One task_finished per task, at its end; task_started per attempt.
        assert [s for s in signals.seen if s[0] == "finished"] == [
            ("finished", "FAILED", 3),
            ("finished", "SUCCESSFUL", 3),
        ]
        assert [s[2] for s in signals.seen if s[0] == "started"] == [1, 2, 3, 1, 2, 3]
        attempts = WorkflowStepAttempt.objects.filter(step__run_id=failing.id).order_by("attempt")
        assert [(a.attempt, a.status, a.holder) for a in attempts] == [
            (1, "failed", "w-2"),
            (2, "failed", "w-2"),
            (3, "failed", "w-2"),
        ]

    def test_running_then_lost_worker_then_ready_again(self) -> None:
        result = tasks.block_first_attempt.enqueue()
        run = WorkflowRun.objects.get(pk=result.id)
        # Enqueued with its one step, pending, under the task's path.
        step = WorkflowStep.objects.get(run=run)
        assert (step.step_name, step.rpc_name, step.status, step.retries) == (
            "task",
            "testproject.testing.tasks.block_first_attempt",
            "pending",
            2,
        )
        assert WorkflowStep.objects.claim(run.pk, "task", step.rpc_name, 60_000, holder="w-dead") is not None
        result.refresh()
        assert (result.status, result.worker_ids) == (TaskResultStatus.RUNNING, ["w-dead"])
        lapse_step(step)
        result.refresh()
        assert result.status == TaskResultStatus.READY
        # The worker whose lease lapsed is replaced by attempt 2, which succeeds.
        drain("w-next")
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert result.return_value == "done"
        assert result.worker_ids == ["w-dead", "w-next"]
        ((lost,),) = [result.errors]
        assert lost.exception_class_path == "pikku_django.errors.WorkerLostError"
        assert issubclass(lost.exception_class, Exception)
        assert "w-dead" in lost.traceback

    def test_a_task_whose_worker_is_lost_on_every_attempt_is_failed_not_stuck_running(self) -> None:
        result = tasks.block.enqueue()  # the default backend: retries 0, worker_losses 2
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.retries, step.worker_losses, step.losses) == (0, 2, 0)
        # Two lost workers are each followed by a new attempt, even with retries 0 ...
        for n in (1, 2, 3):
            assert (
                WorkflowStep.objects.claim_attempt(
                    step.run_id, "task", step.rpc_name, 60_000, holder=f"w-{n}"
                )
                == n
            )
            lapse_step(step)
        # ... and one more fails it.
        with Signals() as signals:
            drain("w-next")
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert result.worker_ids == ["w-1", "w-2", "w-3"]
        # Every lost attempt names its worker, the last one too, which is also
        # a StepLeaseExpiredError (its budget of lost workers is spent).
        assert [e.exception_class_path for e in result.errors] == ["pikku_django.errors.WorkerLostError"] * 3
        assert issubclass(result.errors[-1].exception_class, StepLeaseExpiredError)
        assert "w-3" in result.errors[-1].traceback and "last attempt" in result.errors[-1].traceback
        step.refresh_from_db()
        assert (step.status, step.attempt, step.losses, step.is_exhausted) == ("failed", 3, 3, True)
        assert WorkflowStep.objects.claim_attempt(step.run_id, "task", step.rpc_name, 60_000) is None
        # The task was never called again.
        assert signals.seen == []

    def test_worker_losses_zero_fails_on_the_first_loss(self) -> None:
        result = tasks.block_without_losses.enqueue()
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.retries, step.worker_losses) == (1, 0)
        assert (
            WorkflowStep.objects.claim_attempt(step.run_id, "task", step.rpc_name, 60_000, holder="w-1") == 1
        )
        lapse_step(step)
        drain("w-next")
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        ((lost,),) = [result.errors]
        assert lost.exception_class_path == "pikku_django.errors.WorkerLostError"
        assert issubclass(lost.exception_class, StepLeaseExpiredError) and "w-1" in lost.traceback

    def test_retries_count_only_attempts_that_raised(self) -> None:
        result = tasks.flaky.enqueue(succeed_on=99)  # retries 2, worker_losses 2
        step = WorkflowStep.objects.get(run_id=result.id)
        for n in (1, 2):
            assert (
                WorkflowStep.objects.claim_attempt(
                    step.run_id, "task", step.rpc_name, 60_000, holder=f"w-{n}"
                )
                == n
            )
            lapse_step(step)
        with Signals() as signals:
            drain("w-3")
        result.refresh()
        # Two lost workers, then three attempts that raised: retries + 1 of them.
        assert result.status == TaskResultStatus.FAILED
        assert (result.attempts, result.worker_ids) == (5, ["w-1", "w-2", "w-3", "w-3", "w-3"])
        assert [e.exception_class_path for e in result.errors] == [
            "pikku_django.errors.WorkerLostError",
            "pikku_django.errors.WorkerLostError",
            *["builtins.RuntimeError"] * 3,
        ]
        assert [s for s in signals.seen if s[0] == "finished"] == [("finished", "FAILED", 5)]

    def test_a_loss_after_raises_still_has_its_own_budget(self) -> None:
        result = tasks.flaky.enqueue(succeed_on=99)
        step = WorkflowStep.objects.get(run_id=result.id)
        steps = WorkflowStep.objects
        for n in (1, 2):  # two attempts that raise
            assert steps.claim_attempt(step.run_id, "task", step.rpc_name, 60_000) == n
            steps.finish_attempt(step.pk, n, error=RuntimeError(f"attempt {n} fails"))
        assert steps.claim_attempt(step.run_id, "task", step.rpc_name, 60_000, holder="w-lost") == 3
        lapse_step(step)
        drain("w-4")
        result.refresh()
        # Attempt 4 raises (the third that raised, retries 2 spent): FAILED.
        assert result.status == TaskResultStatus.FAILED, result.errors
        assert result.attempts == 4
        assert result.errors[2].exception_class_path == "pikku_django.errors.WorkerLostError"

    def test_unknown_ids_raise_task_result_does_not_exist(self) -> None:
        backend = task_backends["default"]
        run = WorkflowRun.objects.create_run("test.steps")
        for bad in ["nope", str(uuid.uuid4()), str(run.pk), ""]:
            with pytest.raises(TaskResultDoesNotExist):
                backend.get_result(bad)

    def test_enqueue_inside_a_rolled_back_atomic_leaves_no_run(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            result = tasks.add.enqueue(1, 1)
            assert WorkflowRun.objects.filter(pk=result.id).exists()
            raise RuntimeError("roll back")
        assert not WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).exists()
        with transaction.atomic():
            kept = tasks.add.enqueue(1, 1)
        assert WorkflowRun.objects.filter(pk=kept.id).exists()

    def test_a_path_that_is_not_a_task_is_refused_and_never_called(self) -> None:
        with pytest.raises(TaskPathError, match="_hidden"):
            tasks.hidden_task.enqueue(1)
        assert not WorkflowRun.objects.exists()
        # A stored path naming a plain function (written some other way): the
        # worker refuses it and fails the run; the function is never called.
        marker = Path(f"/tmp/pikku-not-a-task-{uuid.uuid4().hex}")  # noqa: S108
        run = WorkflowRun.objects.create_run(
            TASK_WORKFLOW,
            {
                "task": "testproject.testing.tasks.plain_function",
                "backend": "default",
                "args": [str(marker)],
                "kwargs": {},
                "retries": 0,
                "lease_ms": None,
                "run_after_ms": None,
            },
            internal=True,
        )
        for path in ["os.system", "testproject.testing.models.StepCall", "nowhere.at.all", "os"]:
            with pytest.raises(TaskPathError):
                resolve_task(path)
        drain()
        run.refresh_from_db()
        assert run.status == "failed"
        assert run.error["type"] == "pikku_django.errors.TaskPathError"
        assert not marker.exists()
        assert not WorkflowStep.objects.filter(run=run).exists()
        # Reading its result refuses the path the same way.
        with pytest.raises(TaskPathError):
            task_backends["default"].get_result(str(run.pk))

    def test_bad_arguments_are_refused_before_any_sql(self) -> None:
        with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="JSON"):
            tasks.add.enqueue(object(), 1)
        with pytest.raises(InvalidArgumentError, match="task"):
            task_backends["default"].enqueue(tasks.add.func, [], {})  # type: ignore[arg-type]
        with pytest.raises(InvalidTask):
            tasks.add.using(queue_name="nope")
        with pytest.raises(InvalidTask):
            tasks.add.using(priority=101)
        # Bad OPTIONS are check messages (see test_task_safety.py); such a backend stores nothing.
        for options in [{"retries": -1}, {"retry": 1}, {"worker_losses": -1}]:
            with pytest.raises(PikkuConfigurationError, match="OPTIONS"):
                PikkuTaskBackend("x", {"OPTIONS": options}).enqueue(tasks.add, [1, 2], {})
        assert not WorkflowRun.objects.exists()

    def test_priority_queue_and_run_after_are_stored(self) -> None:
        now = Lease.objects.db_now_ms()
        later = datetime.datetime.fromtimestamp(now / 1000 + 3600, tz=datetime.timezone.utc)
        result = tasks.note.using(priority=7, queue_name="a", run_after=later).enqueue("x")
        run = WorkflowRun.objects.get(pk=result.id)
        assert (run.queue, run.priority) == ("a", 7)
        assert abs(run.wake_at - (now + 3_600_000)) <= 1
        fetched = task_backends["default"].get_result(result.id)
        assert (fetched.task.priority, fetched.task.queue_name) == (7, "a")
        assert fetched.task.run_after is not None
        assert abs(fetched.task.run_after.timestamp() - later.timestamp()) < 0.002
        # Not due: a worker leaves it alone.
        assert drain() == 0
        assert task_backends["default"].get_result(result.id).status == TaskResultStatus.READY

    def test_aenqueue_and_aget_result(self) -> None:
        result = async_to_sync(tasks.add.aenqueue)(4, 5)
        drain()
        fetched = async_to_sync(task_backends["default"].aget_result)(result.id)
        assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 9)
        async_to_sync(result.arefresh)()
        assert result.return_value == 9
