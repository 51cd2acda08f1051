"""
retry_workflow and fork_workflow in one process: a failed, cancelled or timed
out run goes on from where it stopped, with a fresh budget for the step that
stopped it and every older attempt still fenced; a fork copies the steps
before a given one into a new run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError, StepSupersededError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import sweep
from pikku_django.workflows import (
    cancel_workflow,
    fork_workflow,
    retry_workflow,
    run_workflow,
    send_signal,
    start_workflow,
)
from testproject.testing.models import StepCall
from tests.support.factories import lapse_step

NO_RUN = "00000000-0000-0000-0000-000000000000"


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def calls(run: WorkflowRun, step: str) -> int:
    return StepCall.objects.filter(run_id=run.pk, step=step).count()


def attempts(step: WorkflowStep) -> list[tuple[int, str]]:
    return list(
        WorkflowStepAttempt.objects.filter(step=step).order_by("attempt").values_list("attempt", "status")
    )


class RetryTests(TransactionTestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "fixed"

    def tearDown(self) -> None:
        self.dir.cleanup()

    def failed_run(self) -> WorkflowRun:
        run = start_workflow("test.fragile", {"path": str(self.path)}, inline=True)
        assert run.status == "failed" and run.error["step"] == "fragile"
        return run

    def test_a_failed_run_goes_on_from_the_failed_step(self) -> None:
        run = self.failed_run()
        step = WorkflowStep.objects.get(run=run, step_name="fragile")
        assert (step.attempt, step.is_exhausted) == (2, True)
        assert retry_workflow(run.pk) is True
        revived = WorkflowRun.objects.get(pk=run.pk)
        assert (revived.status, revived.error, revived.output, revived.deadline_at) == (
            "running",
            None,
            None,
            None,
        )
        assert revived.wake_at is not None and revived.wake_at <= now_ms()
        step.refresh_from_db()
        assert (step.status, step.attempt, step.budget_base, step.is_exhausted) == ("failed", 2, 2, False)
        self.path.touch()
        done = run_workflow(run.pk)
        assert (done.status, done.output) == ("completed", ["before done", "fixed"])
        # The succeeded step replayed; the failed one ran once more, as attempt 3.
        assert (calls(run, "before"), calls(run, "fragile")) == (1, 3)
        step.refresh_from_db()
        assert (step.status, step.attempt) == ("succeeded", 3)
        assert attempts(step) == [(1, "failed"), (2, "failed"), (3, "succeeded")]

    def test_the_fresh_budget_is_retries_plus_one_attempts(self) -> None:
        run = self.failed_run()
        assert retry_workflow(run.pk) is True
        again = run_workflow(run.pk)
        assert again.status == "failed" and again.error["step"] == "fragile"
        step = WorkflowStep.objects.get(run=run, step_name="fragile")
        assert step.attempt == 4 and calls(run, "fragile") == 4
        assert retry_workflow(run.pk) is True
        self.path.touch()
        assert run_workflow(run.pk).status == "completed"
        step.refresh_from_db()
        assert (step.attempt, step.budget_base) == (5, 4)

    def test_an_earlier_attempt_stays_fenced(self) -> None:
        run = self.failed_run()
        step = WorkflowStep.objects.get(run=run, step_name="fragile")
        assert retry_workflow(run.pk) is True
        # A late result of attempt 2 (or 1) is refused before and after the next claim.
        for late in (1, 2):
            with pytest.raises(StepSupersededError):
                WorkflowStep.objects.finish_attempt(step.pk, late, result="late")
        claimed = WorkflowStep.objects.claim_attempt(run.pk, "fragile", step.rpc_name, 60_000, holder="w")
        assert claimed == 3
        for late in (1, 2):
            with pytest.raises(StepSupersededError):
                WorkflowStep.objects.finish_attempt(step.pk, late, result="late")
            assert not WorkflowStep.objects.refresh_lease(step.pk, 60_000, attempt=late)
        step.refresh_from_db()
        assert (step.status, step.attempt, step.result) == ("running", 3, None)

    def test_the_sweep_judges_the_fresh_budget(self) -> None:
        run = self.failed_run()
        step = WorkflowStep.objects.get(run=run, step_name="fragile")
        assert retry_workflow(run.pk) is True
        steps = WorkflowStep.objects
        assert steps.claim_attempt(run.pk, "fragile", step.rpc_name, 60_000) == 3
        lapse_step(step)
        assert sweep().failed_steps == 0  # attempt 3 of a budget that allows 4
        assert steps.claim_attempt(run.pk, "fragile", step.rpc_name, 60_000) == 4
        lapse_step(step)
        assert steps.get_queryset().spent().filter(pk=step.pk).exists()
        assert sweep().failed_steps == 1
        step.refresh_from_db()
        assert (step.status, step.error["type"]) == ("failed", "pikku_django.errors.StepLeaseExpiredError")

    def test_only_failed_cancelled_and_timed_out_runs(self) -> None:
        completed = start_workflow("test.double", 2, inline=True)
        running = start_workflow("test.double", 3)
        suspended = start_workflow("test.signals", {"name": "go", "waits": 1})
        run_workflow(suspended.pk)
        assert WorkflowRun.objects.get(pk=suspended.pk).status == "suspended"
        before = list(WorkflowRun.objects.order_by("pk").values())
        for run in (completed, running, suspended):
            assert retry_workflow(run.pk) is False
        assert list(WorkflowRun.objects.order_by("pk").values()) == before
        with pytest.raises(InvalidArgumentError, match="^run_id"):
            retry_workflow(NO_RUN)
        with pytest.raises(InvalidArgumentError, match="^run_id"):
            retry_workflow("not a uuid")
        with pytest.raises(InvalidArgumentError, match="^timeout_ms"):
            retry_workflow(running.pk, timeout_ms=0)

    def test_a_cancelled_run_reruns_its_fenced_step(self) -> None:
        run = start_workflow("test.fragile", {"path": str(self.path)})
        steps = WorkflowStep.objects
        started = steps.start_step(run.pk, "before", "testproject.testing.workflows.plain_step", 60_000)
        assert started is not None
        assert cancel_workflow(run.pk) is True
        assert steps.get(pk=started.pk).status == "failed"
        assert retry_workflow(run.pk) is True
        with pytest.raises(StepSupersededError):
            steps.finish_attempt(started.pk, 1, result="late")
        self.path.touch()
        assert run_workflow(run.pk).status == "completed"
        before = steps.get(pk=started.pk)
        assert (before.status, before.attempt, before.result) == ("succeeded", 2, "before done")

    def test_a_timed_out_run_gets_its_deadline_cleared_or_set_anew(self) -> None:
        run = start_workflow("test.sleeper", {"ms": 60_000}, timeout_ms=60_000)
        run_workflow(run.pk)
        WorkflowRun.objects.filter(pk=run.pk).update(deadline_at=now_ms() - 1)
        assert sweep().timed_out_runs == 1
        nap = WorkflowStep.objects.get(run=run, step_name="nap")
        assert nap.status == "failed"
        assert retry_workflow(run.pk, timeout_ms=3_600_000) is True
        revived = WorkflowRun.objects.get(pk=run.pk)
        assert revived.deadline_at is not None
        assert now_ms() + 3_590_000 < revived.deadline_at <= now_ms() + 3_600_000
        nap.refresh_from_db()
        assert (nap.status, nap.attempt, nap.budget_base) == ("scheduled", 2, 1)
        # The sleep goes on to its wake time; it does not fail the run again.
        again = run_workflow(run.pk)
        assert again.status == "running" and again.wake_at == nap.data["wake_at"]
        assert cancel_workflow(run.pk) is True
        assert retry_workflow(run.pk) is True
        assert WorkflowRun.objects.get(pk=run.pk).deadline_at is None

    def test_a_failed_child_step_starts_a_new_child(self) -> None:
        parent = start_workflow("test.fragile_parent", {"path": str(self.path)}, inline=True)
        assert parent.status == "failed" and parent.error["step"] == "child"
        (first,) = WorkflowRun.objects.filter(parent=parent)
        assert first.status == "failed"
        assert retry_workflow(parent.pk) is True
        step = WorkflowStep.objects.get(run=parent, step_name="child")
        assert (step.status, step.child_run_id, step.attempt) == ("pending", None, 2)
        self.path.touch()
        run_workflow(parent.pk)
        second = WorkflowRun.objects.filter(parent=parent).exclude(pk=first.pk).get()
        assert run_workflow(second.pk).status == "completed"
        assert run_workflow(parent.pk).status == "completed"
        assert WorkflowRun.objects.get(pk=first.pk).status == "failed"
        step.refresh_from_db()
        assert (step.status, step.child_run_id, attempts(step)) == (
            "succeeded",
            second.pk,
            [(1, "failed"), (2, "succeeded")],
        )

    def test_a_cancelled_wait_waits_again(self) -> None:
        run = start_workflow("test.signals", {"name": "go", "waits": 1, "timeout_ms": 60_000})
        run_workflow(run.pk)
        assert cancel_workflow(run.pk) is True
        assert retry_workflow(run.pk) is True
        wait = WorkflowStep.objects.get(run=run, step_name="go")
        assert wait.status == "suspended" and wait.data["until"] > now_ms() + 50_000
        assert run_workflow(run.pk).status == "suspended"
        send_signal(run.pk, "go", {"by": "ana"})
        assert run_workflow(run.pk).output == [{"by": "ana"}]


class ForkTests(TransactionTestCase):
    def test_a_fork_runs_on_from_the_step(self) -> None:
        run = start_workflow("test.steps", {"steps": 3}, inline=True)
        original = list(WorkflowStep.objects.filter(run=run).order_by("created_at").values())
        fork = fork_workflow(run.pk, from_step="s1")
        assert fork.pk != run.pk and fork.forked_from_id == run.pk
        assert (fork.workflow, fork.input, fork.status) == (run.workflow, run.input, "running")
        copied = list(WorkflowStep.objects.filter(run=fork).values_list("step_name", "status", "result"))
        assert copied == [("s0", "succeeded", "s0 done")]
        assert run_workflow(fork.pk).output == ["s0 done", "s1 done", "s2 done"]
        for name, expected in (("s0", 1), ("s1", 2), ("s2", 2)):
            assert StepCall.objects.filter(step=name).count() == expected, name
        assert list(WorkflowStep.objects.filter(run=run).order_by("created_at").values()) == original
        assert list(WorkflowRun.objects.get(pk=run.pk).forks.all()) == [fork]

    def test_without_from_step_a_fork_starts_over(self) -> None:
        run = start_workflow("test.steps", {"steps": 2}, inline=True)
        fork = fork_workflow(run.pk)
        assert not WorkflowStep.objects.filter(run=fork).exists()
        assert run_workflow(fork.pk).status == "completed"
        assert StepCall.objects.filter(step="s0").count() == 2

    def test_a_failed_run_forks_past_its_good_steps(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "fixed"
            run = start_workflow("test.fragile", {"path": str(path)}, inline=True)
            fork = fork_workflow(run.pk, "fragile")
            path.touch()
            assert run_workflow(fork.pk).status == "completed"
        assert StepCall.objects.filter(step="before").count() == 1
        assert WorkflowRun.objects.get(pk=run.pk).status == "failed"

    def test_bad_arguments_are_named(self) -> None:
        run = start_workflow("test.steps", {"steps": 1}, inline=True)
        with pytest.raises(InvalidArgumentError, match="from_step.*'nope'"):
            fork_workflow(run.pk, from_step="nope")
        with pytest.raises(InvalidArgumentError, match="^from_step"):
            fork_workflow(run.pk, from_step="")
        with pytest.raises(InvalidArgumentError, match="^run_id"):
            fork_workflow(NO_RUN)
        assert WorkflowRun.objects.count() == 1


class TaskRetryTests(TransactionTestCase):
    def test_a_failed_task_runs_again_and_fails_once_more(self) -> None:
        from pikku_django.tasks.compat import TaskResultStatus, task_finished
        from testproject.testing import tasks

        result = tasks.explode.enqueue("boom")
        run_workflow(result.id)
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert retry_workflow(result.id) is True
        result.refresh()
        assert result.status == TaskResultStatus.READY
        finished: list[str] = []

        def receive(sender: object, task_result: object, **kwargs: object) -> None:
            finished.append(str(task_result.status))  # type: ignore[attr-defined]

        task_finished.connect(receive, dispatch_uid="test-operate")
        try:
            run_workflow(result.id)
        finally:
            task_finished.disconnect(dispatch_uid="test-operate")
        result.refresh()
        assert result.status == TaskResultStatus.FAILED and finished == ["FAILED"]
        assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2


def test_the_store_names_the_waits_as_the_runtime_does() -> None:
    from pikku_django.store import operate
    from pikku_django.workflows import waits

    assert (operate.SLEEP_RPC, operate.CHILD_RPC) == (waits.SLEEP_RPC, waits.CHILD_RPC)
    assert operate.SIGNAL_TIMEOUT_TYPE == waits.SIGNAL_TIMEOUT_TYPE
