"""The workflow runtime in one process: replay, retries, delays, failures, bad input."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TransactionTestCase

from pikku_django.errors import PikkuError, WorkflowRegistrationError
from pikku_django.leases import hold_lease
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import run_workflow, start_workflow, workflow
from testproject.testing.models import StepCall

calls: dict[str, int] = {}


def flaky(key: str, failures: int) -> str:
    """Fails ``failures`` times, then succeeds."""
    calls[key] = calls.get(key, 0) + 1
    if calls[key] <= failures:
        raise RuntimeError(f"{key} failure {calls[key]}")
    return f"{key} ok after {calls[key]}"


@workflow("runtime.flaky")
def flaky_workflow(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.step(
        "flaky",
        flaky,
        input["key"],
        input["failures"],
        retries=input["retries"],
        retry_delay=input.get("delay"),
    )


def lose_run_lease(run_id: str) -> str:
    """Another holder takes this run's lease while the step works."""
    key = f"workflow-run:{run_id}"
    Lease.objects.filter(key=key).expire()
    Lease.objects.acquire(key, "thief", 60_000)
    return "done"


@workflow("runtime.loses_lease")
def loses_lease(ctx: Any, input: Any) -> Any:
    return ctx.step("lose", lose_run_lease, str(ctx.run_id))


def no_json() -> object:
    return object()


@workflow("runtime.bad_result")
def bad_result(ctx: Any, input: Any) -> Any:
    return ctx.step("bad", no_json, retries=0)


@workflow("runtime.bad_output")
def bad_output(ctx: Any, input: Any) -> Any:
    return {1, 2}


def echo(value: Any) -> Any:
    return value


def other(value: Any) -> Any:
    return value


@workflow("runtime.reuse")
def reuse(ctx: Any, input: Any) -> Any:
    ctx.step("same", echo, 1)
    return ctx.step("same", echo, 2)


@workflow("runtime.swap")
def swap(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.step("one", other if input.get("swapped") else echo, 1)


@workflow("runtime.catches")
def catches(ctx: Any, input: Any) -> Any:
    try:
        ctx.step("fails", flaky, "catches", 99, retries=0)
    except Exception as error:  # a workflow may handle a failed step
        return {"handled": str(error)}
    return "not reached"


class RuntimeTests(TransactionTestCase):
    def setUp(self) -> None:
        calls.clear()

    def test_inline_run_of_five_steps_completes_and_replays_without_calls(self) -> None:
        run = start_workflow("test.steps", {"steps": 5}, inline=True)
        assert run.status == "completed"
        assert run.output == [f"s{i} done" for i in range(5)]
        assert run.wake_at is None
        assert StepCall.objects.filter(run_id=run.pk).count() == 5
        assert set(WorkflowStep.objects.filter(run=run).values_list("status", flat=True)) == {"succeeded"}
        # Driving it again: finished, so nothing runs.
        assert run_workflow(run.pk).status == "completed"
        # Even forced back to running, a replay calls no step body again.
        WorkflowRun.objects.filter(pk=run.pk).update(status="running", output=None)
        assert run_workflow(run.pk).status == "completed"
        assert StepCall.objects.filter(run_id=run.pk).count() == 5

    def test_started_run_waits_for_a_worker(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        assert run.status == "running" and WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert not StepCall.objects.exists()
        assert run_workflow(run.pk).status == "completed"

    def test_retries_inline(self) -> None:
        run = start_workflow("runtime.flaky", {"key": "a", "failures": 2, "retries": 2}, inline=True)
        assert run.status == "completed" and run.output == "a ok after 3"
        step = WorkflowStep.objects.get(run=run)
        assert step.attempt == 3
        assert list(step.attempts.values_list("attempt", "status")) == [
            (1, "failed"),
            (2, "failed"),
            (3, "succeeded"),
        ]

    def test_retries_spent_fail_the_run_with_the_steps_error(self) -> None:
        run = start_workflow("runtime.flaky", {"key": "b", "failures": 5, "retries": 1}, inline=True)
        assert run.status == "failed"
        assert run.error["message"] == "b failure 2" and run.error["step"] == "flaky"
        assert calls["b"] == 2

    def test_retry_delay_waits_on_wake_at_not_in_the_worker(self) -> None:
        run = start_workflow("runtime.flaky", {"key": "c", "failures": 1, "retries": 1, "delay": 60_000})
        run = run_workflow(run.pk)
        assert run.status == "running" and calls["c"] == 1
        now = Lease.objects.db_now_ms()
        assert now + 55_000 < run.wake_at <= now + 60_000
        # Not due: a pass now runs nothing.
        run_workflow(run.pk)
        assert calls["c"] == 1
        # Once the delay has passed (moved, not slept), the retry runs.
        WorkflowStep.objects.filter(run=run).update(
            updated_at=WorkflowStep.objects.get(run=run).updated_at.replace(year=2000)
        )
        run = run_workflow(run.pk)
        assert run.status == "completed" and calls["c"] == 2

    def test_short_retry_delay_inline(self) -> None:
        run = start_workflow(
            "runtime.flaky", {"key": "d", "failures": 1, "retries": 1, "delay": 50}, inline=True
        )
        assert run.status == "completed" and calls["d"] == 2

    def test_run_held_elsewhere_is_woken_later_not_failed(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        with hold_lease(run.lease_key, ttl_ms=60_000, holder="elsewhere"):
            before = Lease.objects.db_now_ms()
            again = run_workflow(run.pk)
            assert again.status == "running"
            assert before + 900 <= again.wake_at <= Lease.objects.db_now_ms() + 1_000
            assert not StepCall.objects.exists()
        assert run_workflow(run.pk).status == "completed"

    def test_step_held_by_another_worker_suspends_until_its_lease_lapses(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        WorkflowStep.objects.insert_step(run, "s0", "testproject.testing.workflows.plain_step")
        held = WorkflowStep.objects.claim(run.pk, "s0", "testproject.testing.workflows.plain_step", 60_000)
        again = run_workflow(run.pk)
        assert again.status == "running" and again.wake_at == held.lease_expires_at
        assert not StepCall.objects.exists()

    def test_parked_step_suspends_with_no_wake(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        WorkflowStep.objects.insert_step(run, "s0", "testproject.testing.workflows.plain_step")
        WorkflowStep.objects.claim(run.pk, "s0", "testproject.testing.workflows.plain_step", 60_000)
        WorkflowStep.objects.refresh_lease(WorkflowStep.objects.get(run=run).pk, None)
        again = run_workflow(run.pk)
        assert again.status == "running" and again.wake_at is None

    def test_superseded_attempt_stops_the_pass_quietly(self) -> None:
        seen: dict[str, Any] = {}

        def sneaky(run_id: str) -> str:
            # While this attempt works, its lease lapses and another takes over.
            step = WorkflowStep.objects.get(run_id=run_id, step_name="x")
            WorkflowStep.objects.filter(pk=step.pk).update(lease_expires_at=0)
            seen["newer"] = WorkflowStep.objects.claim(run_id, "x", step.rpc_name, 60_000)
            return "late"

        @workflow("runtime.sneaky")
        def sneaky_workflow(ctx: Any, input: Any) -> Any:
            return ctx.step("x", sneaky, str(ctx.run_id))

        run = run_workflow(start_workflow("runtime.sneaky").pk)
        assert seen["newer"].attempt == 2
        assert run.status == "running"  # not failed: the newer attempt owns the outcome
        step = WorkflowStep.objects.get(run=run)
        assert (step.status, step.attempt, step.result) == ("running", 2, None)

    def test_non_json_result_fails_the_step_clearly(self) -> None:
        run = start_workflow("runtime.bad_result", inline=True)
        assert run.status == "failed"
        assert "not JSON" in run.error["message"] and run.error["step"] == "bad"
        assert WorkflowStepAttempt.objects.get(step__run=run).status == "failed"

    def test_non_json_output_fails_the_run_clearly(self) -> None:
        run = start_workflow("runtime.bad_output", inline=True)
        assert run.status == "failed" and "not JSON" in run.error["message"]

    def test_step_name_reused_is_a_clear_error(self) -> None:
        run = start_workflow("runtime.reuse", inline=True)
        assert run.status == "failed" and "used twice" in run.error["message"]

    def test_step_replayed_with_another_function_is_a_clear_error(self) -> None:
        run = start_workflow("runtime.swap", {}, inline=True)
        assert run.status == "completed"
        WorkflowRun.objects.filter(pk=run.pk).update(status="running", input={"swapped": True})
        run = run_workflow(run.pk)
        assert run.status == "failed" and run.error["type"].endswith("StepFunctionMismatchError")

    def test_workflow_may_handle_a_failed_step(self) -> None:
        run = start_workflow("runtime.catches", inline=True)
        assert run.status == "completed" and "catches failure 1" in run.output["handled"]

    def test_unknown_workflow_and_bad_input(self) -> None:
        with pytest.raises(ValueError, match="name") as info:
            start_workflow("no.such.workflow")
        assert isinstance(info.value, PikkuError)
        with pytest.raises(ValueError, match="input"):
            start_workflow("test.steps", {"when": object()})
        assert not WorkflowRun.objects.exists()
        with pytest.raises(ValueError, match="run_id"):
            run_workflow("not-a-uuid")

    def test_run_of_a_workflow_this_process_does_not_know_waits(self) -> None:
        run = WorkflowRun.objects.create_run("somebody.elses")
        again = run_workflow(run.pk)
        assert again.status == "running" and again.wake_at > Lease.objects.db_now_ms() + 50_000

    def test_registering_a_name_twice_is_an_error(self) -> None:
        with pytest.raises(WorkflowRegistrationError, match="runtime.flaky"):
            workflow("runtime.flaky")(echo)
        with pytest.raises(ValueError, match="name"):
            workflow("")

    def test_a_pass_that_lost_its_run_lease_records_no_outcome(self) -> None:
        run = start_workflow("runtime.loses_lease")
        run = run_workflow(run.pk)
        # The step's outcome is fenced to its attempt and kept; the run's
        # outcome is fenced to the run lease, which the thief holds now.
        assert run.status == "running" and run.output is None
        assert WorkflowStep.objects.get(run=run).status == "succeeded"
        assert Lease.objects.current(run.lease_key).holder == "thief"
        # Once the lease is free, the next pass replays the step and finishes.
        Lease.objects.filter(key=run.lease_key).expire()
        run = run_workflow(run.pk)
        assert run.status == "completed" and run.output == "done"
