"""
A step's held success and the start of the next step in one commit (issue
#14): each keeps its own guard. The success is fenced to its attempt (a
superseded or cancelled attempt starts nothing and writes nothing), the start
to the run's state and the run lease (a refused start leaves the success
written on its own, as a pass that committed it first would).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TransactionTestCase

from pikku_django.errors import StepSupersededError
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.managers.fence import RunFence
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import cancel_workflow, run_workflow, start_workflow, workflow
from tests.support.factories import lapse_step, make_run

LEASE = 60_000
steps = WorkflowStep.objects


def history(step_id: Any) -> list[tuple[int, str]]:
    return list(
        WorkflowStepAttempt.objects.filter(step_id=step_id)
        .order_by("attempt")
        .values_list("attempt", "status")
    )


def cancel_own_run(run_id: str) -> str:
    """A step that cancels its own run (as an operator would while it runs) and returns."""
    cancel_workflow(run_id)
    return "done"


def unreachable() -> None:
    raise AssertionError("a step after a cancel must not start")


@workflow("handoff.cancel_then_step")
def cancel_then_step(ctx: Any, input: dict[str, Any]) -> None:
    ctx.step("first", cancel_own_run, str(ctx.run_id))
    ctx.step("second", unreachable)


class HandoffTests(TransactionTestCase):
    def first(self) -> tuple[WorkflowRun, WorkflowStep, PreparedFinish]:
        run = make_run()
        step = steps.start_step(run.pk, "a", "shop.a", LEASE)
        assert step is not None
        return run, step, steps.prepare_finish(step.pk, 1, result={"a": 1})

    def test_the_success_and_the_next_start_commit_together(self) -> None:
        run, first, finish = self.first()
        second = steps.start_step(run.pk, "b", "shop.b", LEASE, outcome=finish)
        assert second is not None and second.attempt == 1
        done = steps.get(pk=first.pk)
        assert (done.status, done.result, done.lease_expires_at) == ("succeeded", {"a": 1}, None)
        assert history(first.pk) == [(1, "succeeded")]
        assert WorkflowStepAttempt.objects.get(step_id=first.pk).succeeded_at is not None
        assert steps.get(pk=second.pk).status == "running" and history(second.pk) == [(1, "running")]

    def test_a_superseded_success_starts_nothing_and_writes_nothing(self) -> None:
        run, first, finish = self.first()
        lapse_step(first)
        assert steps.claim_attempt(run.pk, "a", "shop.a", LEASE) == 2
        with pytest.raises(StepSupersededError):
            steps.start_step(run.pk, "b", "shop.b", LEASE, outcome=finish)
        assert not steps.filter(run=run, step_name="b").exists()
        stored = steps.get(pk=first.pk)
        assert (stored.status, stored.attempt, stored.result) == ("running", 2, None)
        assert history(first.pk) == [(1, "running"), (2, "running")]

    def test_a_cancel_fences_the_held_success_and_the_start(self) -> None:
        run, first, finish = self.first()
        assert cancel_workflow(run.pk)
        with pytest.raises(StepSupersededError):
            steps.start_step(run.pk, "b", "shop.b", LEASE, outcome=finish)
        assert not steps.filter(run=run, step_name="b").exists()
        assert steps.get(pk=first.pk).status == "failed"

    def test_a_start_refused_for_the_run_lease_leaves_the_success_on_its_own(self) -> None:
        run, first, finish = self.first()
        lease = Lease.objects.acquire(run.lease_key, "w1", LEASE)
        assert lease is not None
        stale = RunFence(run.lease_key, "w1", lease.token)
        Lease.objects.release(lease)
        assert Lease.objects.acquire(run.lease_key, "w2", LEASE) is not None
        assert steps.start_step(run.pk, "b", "shop.b", LEASE, fence=stale, outcome=finish) is None
        assert not steps.filter(run=run, step_name="b").exists()
        assert steps.get(pk=first.pk).status == "succeeded" and history(first.pk) == [(1, "succeeded")]

    def test_a_start_refused_for_the_runs_state_leaves_the_success_on_its_own(self) -> None:
        run, first, finish = self.first()
        WorkflowRun.objects.filter(pk=run.pk).update(status="completed")
        assert steps.start_step(run.pk, "b", "shop.b", LEASE, outcome=finish) is None
        assert not steps.filter(run=run, step_name="b").exists()
        assert steps.get(pk=first.pk).status == "succeeded"

    def test_a_step_another_pass_inserted_leaves_the_success_on_its_own(self) -> None:
        run, first, finish = self.first()
        other = steps.start_step(run.pk, "b", "shop.b", LEASE)
        assert other is not None
        assert steps.start_step(run.pk, "b", "shop.b", LEASE, outcome=finish) is None
        assert steps.get(pk=first.pk).status == "succeeded" and history(first.pk) == [(1, "succeeded")]
        assert steps.get(pk=other.pk).status == "running" and history(other.pk) == [(1, "running")]


class PassTests(TransactionTestCase):
    def test_a_cancel_while_a_success_is_held_stops_the_pass_before_the_next_step(self) -> None:
        run = start_workflow("handoff.cancel_then_step")
        after = run_workflow(run.pk)
        assert after.status == "cancelled"
        assert not steps.filter(run=run, step_name="second").exists()
        first = steps.get(run=run, step_name="first")
        # The cancel fenced the step while its success was held: refused, not recorded.
        assert first.status == "failed" and first.result is None
