"""The step store: claim, step lease, attempt fence, worker-loss budget, stalled."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import TestCase

from pikku_django.errors import PikkuError, StepFunctionMismatchError, StepSupersededError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from tests.support.factories import age, lapse_step, make_run, make_step

LEASE = 60_000


def history(step: WorkflowStep) -> list[tuple[int, str]]:
    return list(
        WorkflowStepAttempt.objects.filter(step=step).order_by("attempt").values_list("attempt", "status")
    )


def snapshot(step: WorkflowStep) -> tuple:
    """Everything a fenced-out write must leave unchanged."""
    row = WorkflowStep.objects.filter(pk=step.pk).values().get()
    attempts = list(WorkflowStepAttempt.objects.filter(step=step).order_by("attempt").values())
    return row, attempts


class RunStoreTests(TestCase):
    def test_create_run(self) -> None:
        before = Lease.objects.db_now_ms()
        run = WorkflowRun.objects.create_run("order", {"order_id": 7})
        run.refresh_from_db()
        assert run.status == "running" and run.workflow == "order" and run.input == {"order_id": 7}
        assert before <= run.wake_at <= Lease.objects.db_now_ms()
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert run.lease_key == f"workflow-run:{run.pk}"
        assert run.created_at is not None and run.updated_at is not None
        assert WorkflowRun.objects.create_run("order").input is None

    def test_create_run_refuses_bad_input(self) -> None:
        for kwargs, argument in [
            ({"workflow": ""}, "workflow"),
            ({"workflow": "w" * 256}, "workflow"),
            ({"workflow": "order", "input": {"when": object()}}, "input"),
            ({"workflow": "order", "input": float("nan")}, "input"),
        ]:
            with pytest.raises(ValueError, match=argument) as info:
                WorkflowRun.objects.create_run(**kwargs)
            assert isinstance(info.value, PikkuError)
        assert not WorkflowRun.objects.exists()

    def test_wake_and_cancel(self) -> None:
        run = make_run()
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        done = make_run()
        WorkflowRun.objects.filter(pk=done.pk).update(status="completed", wake_at=None)
        assert WorkflowRun.objects.filter(pk__in=[run.pk, done.pk]).wake() == 1
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert WorkflowRun.objects.get(pk=done.pk).wake_at is None
        assert WorkflowRun.objects.filter(pk__in=[run.pk, done.pk]).cancel() == 1
        assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
        assert WorkflowRun.objects.get(pk=done.pk).status == "completed"


class InsertStepTests(TestCase):
    def test_insert_step(self) -> None:
        run = make_run()
        step = WorkflowStep.objects.insert_step(
            run, "charge", "shop.charge", {"cents": 5}, retries=2, retry_delay=100
        )
        step.refresh_from_db()
        assert (step.status, step.attempt, step.retries, step.retry_delay) == ("pending", 1, 2, 100)
        assert step.data == {"cents": 5} and step.lease_expires_at is None and step.run_id == run.pk
        assert history(step) == [(1, "pending")]

    def test_default_retries_from_settings(self) -> None:
        assert make_step().retries == 5
        with self.settings(PIKKU_STEP_RETRIES=0):
            assert make_step().retries == 0

    def test_step_name_once_per_run(self) -> None:
        run = make_run()
        make_step(run, "charge")
        with pytest.raises(ValueError, match="step_name"):
            make_step(run, "charge")
        assert WorkflowStep.objects.filter(run=run).count() == 1
        make_step(make_run(), "charge")  # another run may use it

    def test_bad_arguments(self) -> None:
        run = make_run()
        for kwargs, argument in [
            ({"step_name": ""}, "step_name"),
            ({"rpc_name": ""}, "rpc_name"),
            ({"data": {1, 2}}, "data"),
            ({"retries": -1}, "retries"),
            ({"retries": True}, "retries"),
            ({"retry_delay": -5}, "retry_delay"),
        ]:
            args = {"step_name": "s", "rpc_name": "r", **kwargs}
            with pytest.raises(ValueError, match=argument):
                WorkflowStep.objects.insert_step(run, **args)
        assert not WorkflowStep.objects.exists()


class ClaimTests(TestCase):
    def claim(
        self, step: WorkflowStep, rpc_name: str = "shop.charge", lease_ms: int = LEASE
    ) -> WorkflowStep | None:
        return WorkflowStep.objects.claim(step.run_id, step.step_name, rpc_name, lease_ms)

    def test_pending_becomes_running_under_a_lease(self) -> None:
        step = make_step()
        before = Lease.objects.db_now_ms()
        claimed = self.claim(step)
        assert claimed is not None and claimed.pk == step.pk
        assert (claimed.status, claimed.attempt) == ("running", 1)
        assert before + LEASE <= claimed.lease_expires_at <= Lease.objects.db_now_ms() + LEASE
        assert history(step) == [(1, "running")]
        assert WorkflowStepAttempt.objects.get(step=step).running_at is not None

    def test_scheduled_becomes_running_with_same_attempt(self) -> None:
        step = make_step()
        WorkflowStep.objects.filter(pk=step.pk).update(status="scheduled", attempt=2)
        WorkflowStepAttempt.objects.create(
            step=step, attempt=2, status="scheduled", created_at=step.created_at
        )
        claimed = self.claim(step)
        assert claimed is not None and (claimed.status, claimed.attempt) == ("running", 2)
        assert history(step) == [(1, "pending"), (2, "running")]

    def test_live_lease_refuses_a_second_claim(self) -> None:
        step = make_step()
        first = self.claim(step)
        assert self.claim(step) is None
        step.refresh_from_db()
        assert step.lease_expires_at == first.lease_expires_at and step.attempt == 1

    def test_lapsed_lease_is_reclaimed_as_a_new_attempt(self) -> None:
        step = make_step()
        self.claim(step)
        lapse_step(step)
        second = self.claim(step)
        assert second is not None and (second.status, second.attempt) == ("running", 2)
        assert second.lease_expires_at > Lease.objects.db_now_ms()
        assert history(step) == [(1, "running"), (2, "running")]
        assert self.claim(step) is None

    def test_failed_step_with_attempts_left_is_retried(self) -> None:
        step = make_step(retries=1)
        self.claim(step)
        WorkflowStep.objects.record_error(step.pk, RuntimeError("card declined"), attempt=1)
        again = self.claim(step)
        assert again is not None and again.attempt == 2 and again.error is None
        assert history(step) == [(1, "failed"), (2, "running")]

    def test_failed_step_with_attempts_spent_is_settled(self) -> None:
        step = make_step(retries=0)
        self.claim(step)
        WorkflowStep.objects.record_error(step.pk, RuntimeError("card declined"), attempt=1)
        before = snapshot(step)
        assert self.claim(step) is None
        assert snapshot(step) == before

    def test_succeeded_step_is_never_claimed(self) -> None:
        step = make_step()
        self.claim(step)
        WorkflowStep.objects.record_result(step.pk, {"ok": 1}, attempt=1)
        assert self.claim(step) is None

    def test_parked_step_is_never_claimed(self) -> None:
        step = make_step()
        self.claim(step)
        assert WorkflowStep.objects.refresh_lease(step.pk, None, attempt=1)
        step.refresh_from_db()
        assert step.status == "running" and step.lease_expires_at is None
        assert self.claim(step) is None

    def test_suspended_step_is_never_claimed(self) -> None:
        step = make_step()
        WorkflowStep.objects.filter(pk=step.pk).update(status="suspended")
        assert self.claim(step) is None

    def test_other_function_raises_and_changes_nothing(self) -> None:
        step = make_step()
        before = snapshot(step)
        with pytest.raises(StepFunctionMismatchError):
            self.claim(step, rpc_name="shop.refund")
        assert snapshot(step) == before
        self.claim(step)
        lapse_step(step)
        before = snapshot(step)
        with pytest.raises(StepFunctionMismatchError):
            self.claim(step, rpc_name="shop.refund")
        assert snapshot(step) == before

    def test_unknown_step_and_bad_lease(self) -> None:
        run = make_run()
        with pytest.raises(ValueError, match="step_name"):
            WorkflowStep.objects.claim(run.pk, "nope", "shop.charge", LEASE)
        step = make_step(run)
        for bad in [0, -1, True, None]:
            with pytest.raises(ValueError, match="lease_ms"):
                WorkflowStep.objects.claim(run.pk, step.step_name, "shop.charge", bad)

    def test_claim_is_one_statement_on_postgresql(self) -> None:
        step = make_step()
        statements: list[str] = []

        def count(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
            statements.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            self.claim(step)
        writes = [s for s in statements if not s.lstrip().upper().startswith(("SAVEPOINT", "RELEASE"))]
        # MySQL/MariaDB send the claim, its read-back and its history row in one round trip.
        expected = {"postgresql": 1, "sqlite": 2, "mysql": 1}[connection.vendor]
        assert len(writes) == expected, writes


class FenceTests(TestCase):
    """After attempt 2 takes over, attempt 1 can change nothing."""

    def setUp(self) -> None:
        self.step = make_step(retries=3)
        WorkflowStep.objects.claim(self.step.run_id, "charge", "shop.charge", LEASE)
        lapse_step(self.step)
        WorkflowStep.objects.claim(self.step.run_id, "charge", "shop.charge", LEASE)

    def test_attempt_one_is_refused_everywhere(self) -> None:
        before = snapshot(self.step)
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(self.step.pk, {"late": True}, attempt=1)
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_error(self.step.pk, RuntimeError("late"), attempt=1)
        assert WorkflowStep.objects.refresh_lease(self.step.pk, LEASE, attempt=1) is False
        assert WorkflowStep.objects.refresh_lease(self.step.pk, None, attempt=1) is False
        assert snapshot(self.step) == before

    def test_attempt_two_lands(self) -> None:
        assert WorkflowStep.objects.refresh_lease(self.step.pk, LEASE, attempt=2)
        WorkflowStep.objects.record_result(self.step.pk, {"charged": 5}, attempt=2)
        self.step.refresh_from_db()
        assert (self.step.status, self.step.result, self.step.lease_expires_at) == (
            "succeeded",
            {"charged": 5},
            None,
        )
        assert history(self.step) == [(1, "running"), (2, "succeeded")]
        row = WorkflowStepAttempt.objects.get(step=self.step, attempt=2)
        assert row.result == {"charged": 5} and row.succeeded_at is not None
        # A second record by the same attempt is refused too.
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(self.step.pk, {"again": 1}, attempt=2)

    def test_attempt_two_error_lands(self) -> None:
        WorkflowStep.objects.record_error(self.step.pk, ValueError("card declined"), attempt=2)
        self.step.refresh_from_db()
        assert self.step.status == "failed"
        assert self.step.error["message"] == "card declined"
        assert self.step.error["type"] == "builtins.ValueError"
        assert history(self.step) == [(1, "running"), (2, "failed")]

    def test_third_claim_fences_out_one_and_two(self) -> None:
        lapse_step(self.step)
        third = WorkflowStep.objects.claim(self.step.run_id, "charge", "shop.charge", LEASE)
        assert third.attempt == 3
        before = snapshot(self.step)
        for attempt in (1, 2):
            assert not WorkflowStep.objects.refresh_lease(self.step.pk, LEASE, attempt=attempt)
            with pytest.raises(StepSupersededError):
                WorkflowStep.objects.record_result(self.step.pk, 1, attempt=attempt)
        assert snapshot(self.step) == before

    def test_results_must_be_json(self) -> None:
        before = snapshot(self.step)
        with pytest.raises(ValueError, match="result"):
            WorkflowStep.objects.record_result(self.step.pk, {"when": object()}, attempt=2)
        with pytest.raises(ValueError, match="error"):
            WorkflowStep.objects.record_error(self.step.pk, "not an exception", attempt=2)  # type: ignore[arg-type]
        assert snapshot(self.step) == before

    def test_unfenced_record_writes_the_current_attempt(self) -> None:
        WorkflowStep.objects.record_result(self.step.pk, "done")
        assert history(self.step) == [(1, "running"), (2, "succeeded")]


class BudgetTests(TestCase):
    """retries=1: two attempts; a worker lost on both fails the step loudly."""

    def setUp(self) -> None:
        self.run = make_run()
        WorkflowRun.objects.filter(pk=self.run.pk).update(wake_at=None)
        self.step = make_step(self.run, retries=1)
        self.claim()
        lapse_step(self.step)
        assert self.claim().attempt == 2

    def claim(self) -> WorkflowStep | None:
        return WorkflowStep.objects.claim(self.run.pk, "charge", "shop.charge", LEASE)

    def test_lost_twice_fails_the_step_and_wakes_the_run(self) -> None:
        lapse_step(self.step)
        assert self.claim() is None
        self.step.refresh_from_db()
        assert self.step.status == "failed" and self.step.lease_expires_at is None
        assert "lost its worker on every one of its 2 attempts" in self.step.error["message"]
        assert self.step.error["type"].endswith("StepLeaseExpiredError")
        assert history(self.step) == [(1, "running"), (2, "failed")]
        self.run.refresh_from_db()
        assert self.run.wake_at is not None and self.run.wake_at <= Lease.objects.db_now_ms()
        woken_at = self.run.wake_at
        # Settled: later claims change nothing and do not wake the run again.
        WorkflowRun.objects.filter(pk=self.run.pk).update(wake_at=None)
        assert self.claim() is None
        assert WorkflowRun.objects.get(pk=self.run.pk).wake_at is None
        assert woken_at == 0  # woken out of turn: ahead of the queue

    def test_renewed_before_the_write_stays_running(self) -> None:
        lapse_step(self.step)
        stale = WorkflowStep.objects.get(pk=self.step.pk)  # read as lapsed...
        assert WorkflowStep.objects.refresh_lease(self.step.pk, LEASE, attempt=2)  # ...renewed meanwhile
        assert WorkflowStep.objects.fail_lost(stale) is False
        assert self.claim() is None
        self.step.refresh_from_db()
        assert self.step.status == "running" and self.step.attempt == 2
        assert self.step.lease_expires_at > Lease.objects.db_now_ms()

    def test_slow_last_worker_cannot_overwrite_the_failure(self) -> None:
        lapse_step(self.step)
        assert self.claim() is None
        before = snapshot(self.step)
        assert WorkflowStep.objects.refresh_lease(self.step.pk, LEASE, attempt=2) is False
        assert WorkflowStep.objects.refresh_lease(self.step.pk, None, attempt=2) is False
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(self.step.pk, {"late": True}, attempt=2)
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.record_result(self.step.pk, {"late": True})
        assert snapshot(self.step) == before


class StalledTests(TestCase):
    IDLE = 60_000

    def stalled_run(self, step_status: str | None = "pending", **step_fields) -> WorkflowRun:  # type: ignore[no-untyped-def]
        run = make_run()
        if step_status is not None:
            step = make_step(run)
            WorkflowStep.objects.filter(pk=step.pk).update(status=step_status, **step_fields)
            age(WorkflowStep, step.pk, self.IDLE * 2)
        age(WorkflowRun, run.pk, self.IDLE * 2)
        return run

    def stalled(self) -> list:
        return WorkflowRun.objects.stalled(self.IDLE)

    def test_idle_run_with_only_a_pending_step_is_stalled(self) -> None:
        run = self.stalled_run("pending")
        assert self.stalled() == [run.pk]

    def test_steps_in_flight_hold_it_out(self) -> None:
        now = Lease.objects.db_now_ms()
        self.stalled_run("scheduled")
        self.stalled_run("suspended")
        self.stalled_run("running", lease_expires_at=now + LEASE)
        self.stalled_run("running", lease_expires_at=None)
        assert self.stalled() == []

    def test_lapsed_lease_is_not_in_flight(self) -> None:
        run = self.stalled_run("running", lease_expires_at=Lease.objects.db_now_ms() - 1)
        assert self.stalled() == [run.pk]

    def test_recent_activity_holds_it_out(self) -> None:
        recent_run = make_run()  # the run itself touched just now
        make_step(recent_run)
        run = self.stalled_run("pending")
        step = make_step(run, "refund")  # a step touched just now
        age(WorkflowRun, run.pk, self.IDLE * 2)
        assert self.stalled() == []
        age(WorkflowStep, step.pk, self.IDLE * 2)
        assert run.pk in self.stalled() and recent_run.pk not in self.stalled()

    def test_finished_runs_never_appear(self) -> None:
        for status in ["completed", "failed", "cancelled", "suspended"]:
            run = self.stalled_run("pending")
            WorkflowRun.objects.filter(pk=run.pk).update(status=status)
        assert self.stalled() == []

    def test_oldest_first_and_limit(self) -> None:
        newer = self.stalled_run(None)
        older = self.stalled_run(None)
        age(WorkflowRun, older.pk, self.IDLE)
        assert self.stalled() == [older.pk, newer.pk]
        assert WorkflowRun.objects.stalled(self.IDLE, limit=1) == [older.pk]

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="idle_ms"):
            WorkflowRun.objects.stalled(-1)
        with pytest.raises(ValueError, match="limit"):
            WorkflowRun.objects.stalled(1, limit=0)
