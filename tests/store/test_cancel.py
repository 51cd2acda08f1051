"""
Cancel and deadlines in one process: a cancelled run's steps are fenced out,
its children cancelled; a run past its deadline fails with
WorkflowTimeoutError, before its next step or through the sweep.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError, StepSupersededError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import sweep
from pikku_django.workflows import cancel_workflow, run_workflow, start_workflow
from pikku_django.workflows.context import RunContext
from pikku_django.workflows.waits import Stop
from testproject.testing.models import StepCall
from tests.support.factories import make_step

CANCELLED = "pikku_django.errors.WorkflowCancelledError"
TIMED_OUT = "pikku_django.errors.WorkflowTimeoutError"


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def rows(run: WorkflowRun) -> dict[str, Any]:
    return {
        "run": list(WorkflowRun.objects.filter(pk=run.pk).values()),
        "steps": list(WorkflowStep.objects.filter(run=run).order_by("step_name").values()),
        "attempts": list(WorkflowStepAttempt.objects.filter(step__run=run).order_by("pk").values()),
    }


def never_called(*args: Any) -> None:
    raise AssertionError("a step of a cancelled run was started")


class CancelTests(TransactionTestCase):
    def test_cancel_says_whether_the_run_was_unfinished(self) -> None:
        run = start_workflow("test.sleeper", {"ms": 60_000})
        assert cancel_workflow(run.pk) is True
        run = WorkflowRun.objects.get(pk=run.pk)
        assert (run.status, run.wake_at, run.error["type"]) == ("cancelled", None, CANCELLED)
        assert cancel_workflow(run.pk) is False
        done = start_workflow("test.double", 2, inline=True)
        assert done.status == "completed" and cancel_workflow(done.pk) is False
        with pytest.raises(InvalidArgumentError, match="^run_id: no workflow run"):
            cancel_workflow("00000000-0000-0000-0000-000000000000")
        # run_workflow on a cancelled run changes nothing.
        before = rows(run)
        assert run_workflow(run.pk).status == "cancelled"
        assert rows(run) == before

    def test_a_running_step_is_fenced_out_at_once(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        step = make_step(run, "s0", "shop.s0")
        claimed = WorkflowStep.objects.claim(run.pk, "s0", "shop.s0", 60_000)
        assert claimed is not None
        assert cancel_workflow(run.pk)
        fenced = WorkflowStep.objects.get(pk=step.pk)
        assert (fenced.status, fenced.lease_expires_at, fenced.error["type"]) == ("failed", None, CANCELLED)
        # Its renewal answers "not yours"; its late result is refused and changes no row.
        before = rows(run)
        assert WorkflowStep.objects.refresh_lease(step.pk, 60_000, attempt=claimed.attempt) is False
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(step.pk, "late", attempt=claimed.attempt)
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_error(step.pk, RuntimeError("late"), attempt=claimed.attempt)
        assert rows(run) == before

    def test_a_stale_pass_starts_no_step_after_the_cancel(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        make_step(run, "s1", f"{never_called.__module__}.{never_called.__qualname__}")
        ctx = RunContext(run, using="default")
        cancel_workflow(run.pk)
        with pytest.raises(Stop):
            ctx.step("s0", never_called)
        # A new step is never started: its start is guarded by the run's state.
        assert not WorkflowStep.objects.filter(run=run, step_name="s0").exists()
        with pytest.raises(Stop):
            ctx.step("s1", never_called)
        # A step that existed was claimed, then fenced before its function ran.
        step = WorkflowStep.objects.get(run=run, step_name="s1")
        assert (step.status, step.error["type"]) == ("failed", CANCELLED)
        with pytest.raises(Stop):
            ctx.sleep("nap", 1000)

    def test_children_are_cancelled_with_their_parent(self) -> None:
        nested = {"child": "test.parent", "child_input": {"child": "test.signals"}}
        parent = run_workflow(start_workflow("test.parent", nested).pk)
        child = WorkflowRun.objects.get(parent=parent)
        # The child starts a grandchild, which waits for a signal.
        run_workflow(child.pk)
        grandchild = WorkflowRun.objects.get(parent=child)
        run_workflow(grandchild.pk)
        assert WorkflowRun.objects.get(pk=grandchild.pk).status == "suspended"

        assert cancel_workflow(parent.pk) is True
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert statuses == {parent.pk: "cancelled", child.pk: "cancelled", grandchild.pk: "cancelled"}
        # Every step in flight is fenced: the parked ones and the wait.
        assert set(WorkflowStep.objects.values_list("status", flat=True)) == {"failed"}
        assert not WorkflowRun.objects.due().exists()


class DeadlineTests(TransactionTestCase):
    def past_deadline(self, run: WorkflowRun) -> None:
        """Move the run's deadline into the past on the DB clock."""
        WorkflowRun.objects.filter(pk=run.pk).update(deadline_at=now_ms() - 1)

    def test_a_deadline_caps_a_sleep_and_is_checked_before_the_next_step(self) -> None:
        started = now_ms()
        run = start_workflow("test.sleeper", {"ms": 600_000}, timeout_ms=300_000)
        assert run.deadline_at is not None and started + 300_000 <= run.deadline_at <= now_ms() + 300_000
        run = run_workflow(run.pk)
        # Woken at its deadline, not at the end of its sleep.
        assert (run.status, run.wake_at) == ("running", run.deadline_at)
        self.past_deadline(run)
        run = run_workflow(run.pk)
        assert (run.status, run.error["type"]) == ("failed", TIMED_OUT)
        assert WorkflowStep.objects.get(run=run, step_name="nap").status == "failed"
        assert not StepCall.objects.filter(run_id=run.pk, step="after").exists()

    def test_the_sweep_times_out_a_sleeping_run(self) -> None:
        run = run_workflow(start_workflow("test.sleeper", {"ms": 600_000}, timeout_ms=300_000).pk)
        assert sweep().timed_out_runs == 0
        self.past_deadline(run)
        report = sweep(dry_run=True)
        assert report.timed_out_runs == 1 and WorkflowRun.objects.get(pk=run.pk).status == "running"
        report = sweep()
        assert report.timed_out_runs == 1 and "timed out 1 runs" in report.summary()
        run = WorkflowRun.objects.get(pk=run.pk)
        assert (run.status, run.wake_at, run.error["type"]) == ("failed", None, TIMED_OUT)
        assert sweep().timed_out_runs == 0

    def test_the_sweep_times_out_a_waiting_run_and_cancels_its_children(self) -> None:
        run = run_workflow(start_workflow("test.signals", {"name": "x", "waits": 1}, timeout_ms=300_000).pk)
        parent = run_workflow(start_workflow("test.parent", {"child": "test.sleeper"}, timeout_ms=300_000).pk)
        child = WorkflowRun.objects.get(parent=parent)
        assert (run.status, run.wake_at) == ("suspended", run.deadline_at)
        self.past_deadline(run)
        self.past_deadline(parent)
        assert sweep().timed_out_runs == 2
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert statuses == {run.pk: "failed", parent.pk: "failed", child.pk: "cancelled"}
        assert WorkflowRun.objects.get(pk=run.pk).error["type"] == TIMED_OUT
        assert WorkflowStep.objects.get(run=run).status == "failed"
