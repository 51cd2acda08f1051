"""
Sleep, signals and child runs in one process: where a run waits, what wakes
it, what a replay returns; bad arguments refused before any SQL.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.errors import (
    InvalidArgumentError,
    PikkuError,
    SignalTimeoutError,
    StepFailedError,
    WorkflowCancelledError,
    WorkflowNotFoundError,
    WorkflowTimeoutError,
)
from pikku_django.models import Lease, WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.workflows import run_workflow, send_signal, start_workflow
from pikku_django.workflows.context import RunContext
from pikku_django.workflows.waits import Suspend, suspend_run
from testproject.testing.models import StepCall
from tests.support.children import poll_until


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def calls(run: WorkflowRun, step: str) -> int:
    return StepCall.objects.filter(run_id=run.pk, step=step).count()


def fresh(run: WorkflowRun) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run.pk)


class SleepTests(TransactionTestCase):
    def test_a_sleep_parks_the_run_until_its_wake_time_on_the_db_clock(self) -> None:
        run = start_workflow("test.sleeper", {"ms": 60_000})
        before = now_ms()
        run = run_workflow(run.pk)
        after = now_ms()
        nap = WorkflowStep.objects.get(run=run, step_name="nap")
        assert (nap.status, nap.rpc_name) == ("scheduled", "pikku.sleep")
        wake_at = nap.data["wake_at"]
        assert before + 60_000 <= wake_at <= after + 60_000
        # Running, due at the wake time, holding no lease, in flight (not stalled).
        assert (run.status, run.wake_at) == ("running", wake_at)
        assert not WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert WorkflowStep.objects.in_flight().filter(pk=nap.pk).exists()
        assert run.pk not in WorkflowRun.objects.stalled(0)
        # Driven again early (say, woken by hand), it sleeps on with the same wake time.
        run = run_workflow(run.pk)
        assert (run.status, run.wake_at) == ("running", wake_at)
        assert WorkflowStep.objects.get(pk=nap.pk).data["wake_at"] == wake_at

        # Moved into the past on the DB clock, the sleep passes at once.
        WorkflowStep.objects.filter(pk=nap.pk).update(data={"ms": 60_000, "wake_at": now_ms() - 1})
        run = run_workflow(run.pk)
        assert run.status == "completed"
        assert run.output == ["before done", "after done"]
        assert calls(run, "before") == 1 and calls(run, "after") == 1
        assert WorkflowStep.objects.get(pk=nap.pk).status == "succeeded"

    def test_bad_sleeps_are_refused_before_any_sql(self) -> None:
        ctx = RunContext(WorkflowRun.objects.create_run("test.sleeper"), using="default")
        with CaptureQueriesContext(connection) as queries:
            for bad in (0, -5, 1.5, True, None):
                with self.assertRaisesRegex(InvalidArgumentError, "^ms "):
                    ctx.sleep("nap", bad)  # type: ignore[arg-type]
            with self.assertRaisesRegex(InvalidArgumentError, "^name "):
                ctx.sleep("", 10)
        assert len(queries) == 0


class SignalTests(TransactionTestCase):
    def test_a_signal_sent_before_the_wait_is_consumed_by_it(self) -> None:
        run = start_workflow("test.signals", {"name": "approval", "waits": 1})
        send_signal(run.pk, "approval", {"by": "ana"})
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", [{"by": "ana"}])
        signal = WorkflowSignal.objects.get(run=run)
        assert signal.consumed_by is not None and signal.consumed_by.step_name == "approval"

    def test_a_signal_sent_while_the_run_waits_wakes_it(self) -> None:
        run = start_workflow("test.signals", {"name": "approval", "waits": 1})
        run = run_workflow(run.pk)
        step = WorkflowStep.objects.get(run=run)
        assert (run.status, run.wake_at) == ("suspended", None)
        assert (step.status, step.data["signal"]) == ("suspended", "approval")
        assert not WorkflowRun.objects.due().filter(pk=run.pk).exists()
        # A signal of another name does not wake it.
        send_signal(run.pk, "other", 1)
        assert fresh(run).status == "suspended"
        send_signal(run.pk, "approval", "yes")
        assert fresh(run).status == "running"
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", ["yes"])
        assert WorkflowSignal.objects.get(name="other").consumed_by is None

    def test_a_signal_that_lands_while_the_pass_suspends_still_wakes_the_run(self) -> None:
        run = start_workflow("test.signals", {"name": "approval", "waits": 1})
        run = run_workflow(run.pk)
        # As a pass sees it while it suspends: the run still running, the
        # sender's signal stored but its wake already spent on the running run.
        WorkflowRun.objects.filter(pk=run.pk).update(status="running")
        WorkflowSignal.objects.create(run=run, name="approval", payload="late", sent_at=now_ms())
        signals = WorkflowSignal.objects
        suspend = Suspend(
            None, "waits", status="suspended", recheck=lambda: signals.waiting_for(run, "approval")
        )
        suspend_run(run, suspend)
        run = fresh(run)
        assert run.status == "running" and WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert run_workflow(run.pk).output == ["late"]

    def test_two_waits_of_one_name_consume_two_signals_in_order_and_replay_keeps_them(self) -> None:
        run = start_workflow("test.signals", {"name": "tick", "waits": 2})
        send_signal(run.pk, "tick", 1)
        run = run_workflow(run.pk)  # the first wait takes 1; the second waits
        assert run.status == "suspended"
        send_signal(run.pk, "tick", 2)
        send_signal(run.pk, "tick", 3)
        run = run_workflow(run.pk)  # replays the first wait (1), the second takes 2
        assert (run.status, run.output) == ("completed", [1, 2])
        consumed = dict(
            WorkflowSignal.objects.filter(run=run).values_list("payload", "consumed_by__step_name")
        )
        assert consumed == {1: "tick", 2: "tick#2", 3: None}

    def test_a_timeout_raises_into_the_workflow(self) -> None:
        run = start_workflow("test.signals", {"name": "never", "waits": 1, "timeout_ms": 300})
        started = now_ms()
        run = run_workflow(run.pk)
        assert run.status == "suspended"
        assert run.wake_at is not None and started + 300 <= run.wake_at <= now_ms() + 300
        # A suspended run is due once its wait times out, on the DB clock.
        poll_until(lambda: WorkflowRun.objects.due().filter(pk=run.pk).exists(), timeout=30)
        run = run_workflow(run.pk)
        assert run.status == "failed"
        assert run.error["type"] == "pikku_django.errors.SignalTimeoutError"
        # A signal sent after the timeout is kept, not consumed by the failed wait.
        assert WorkflowStep.objects.get(run=run).status == "failed"

    def test_a_caught_timeout_lets_the_run_go_on(self) -> None:
        run = start_workflow("test.signal_or_timeout", {"timeout_ms": 300})
        run = run_workflow(run.pk)
        poll_until(lambda: WorkflowRun.objects.due().filter(pk=run.pk).exists(), timeout=30)
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", {"answer": "timed out", "after": "after done"})
        # Replayed, the timeout is raised again, the same way.
        WorkflowRun.objects.filter(pk=run.pk).update(status="running")
        assert run_workflow(run.pk).output == {"answer": "timed out", "after": "after done"}
        assert calls(run, "after") == 1

    def test_signals_to_unknown_or_finished_runs_and_bad_payloads_are_refused(self) -> None:
        run = start_workflow("test.signals", {"name": "x", "waits": 1})
        with CaptureQueriesContext(connection) as queries:
            with self.assertRaisesRegex(InvalidArgumentError, "^payload "):
                send_signal(run.pk, "x", object())
            with self.assertRaisesRegex(InvalidArgumentError, "^name "):
                send_signal(run.pk, "", 1)
        assert len(queries) == 0
        with self.assertRaisesRegex(InvalidArgumentError, "^run_id: no workflow run"):
            send_signal("00000000-0000-0000-0000-000000000000", "x")
        with self.assertRaisesRegex(InvalidArgumentError, "^run_id: no workflow run"):
            send_signal("not a uuid", "x")
        WorkflowRun.objects.filter(pk=run.pk).update(status="completed")
        with self.assertRaisesRegex(InvalidArgumentError, "^run_id: .* is completed"):
            send_signal(run.pk, "x")
        assert not WorkflowSignal.objects.exists()

    def test_bad_waits_are_refused_before_any_sql(self) -> None:
        ctx = RunContext(WorkflowRun.objects.create_run("test.signals"), using="default")
        with CaptureQueriesContext(connection) as queries:
            with self.assertRaisesRegex(InvalidArgumentError, "^timeout_ms "):
                ctx.wait_for_signal("x", timeout_ms=0)
            with self.assertRaisesRegex(InvalidArgumentError, "^name "):
                ctx.wait_for_signal(7)  # type: ignore[arg-type]
        assert len(queries) == 0


class ChildRunTests(TransactionTestCase):
    def test_the_parent_gets_the_childs_output_and_is_woken_by_it_not_by_polling(self) -> None:
        run = start_workflow("test.parent", {"child": "test.double", "child_input": 21})
        run = run_workflow(run.pk)
        step = WorkflowStep.objects.get(run=run)
        child = WorkflowRun.objects.get(parent=run)
        assert (child.workflow, child.input, child.status) == ("test.double", 21, "running")
        # Parked: running with no lease, the child set; the parent holds no
        # worker and is not due until the child ends.
        assert (step.status, step.lease_expires_at, step.child_run_id) == ("running", None, child.pk)
        assert (run.status, run.wake_at) == ("running", None)
        assert run.pk not in WorkflowRun.objects.stalled(0)
        # Replayed meanwhile, it waits on and starts no second child.
        run_workflow(run.pk)
        assert list(run.children.values_list("pk", flat=True)) == [child.pk]

        child = run_workflow(child.pk)
        assert (child.status, child.output) == ("completed", 42)
        # The child's outcome reached the step, and the parent is due, at once.
        step = WorkflowStep.objects.get(pk=step.pk)
        assert (step.status, step.result) == ("succeeded", 42)
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", {"child": 42})

    def test_an_inline_parent_drives_its_child_inline(self) -> None:
        run = start_workflow("test.parent", {"child": "test.double", "child_input": 5}, inline=True)
        assert (run.status, run.output) == ("completed", {"child": 10})
        assert WorkflowRun.objects.get(parent=run).status == "completed"
        # A child that waits for a signal leaves both waiting, returned as they are.
        run = start_workflow("test.parent", {"child": "test.signals"}, inline=True)
        assert (run.status, WorkflowRun.objects.get(parent=run).status) == ("running", "suspended")

    def test_a_failed_child_fails_the_parents_step_with_its_error(self) -> None:
        run = run_workflow(start_workflow("test.parent", {"child": "test.fails"}).pk)
        child = run_workflow(WorkflowRun.objects.get(parent=run).pk)
        assert child.status == "failed"
        step = WorkflowStep.objects.get(run=run)
        assert step.status == "failed" and step.error["message"] == "the child gave up"
        assert step.error["child_run"] == str(child.pk)
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", {"child_failed": "the child gave up"})

    def test_a_child_cancelled_on_its_own_fails_the_parents_step(self) -> None:
        run = run_workflow(start_workflow("test.parent", {"child": "test.signals"}).pk)
        child = WorkflowRun.objects.get(parent=run)
        # The child is cancelled on its own: its parent's step fails with the cancel.
        from pikku_django.workflows import cancel_workflow

        assert cancel_workflow(child.pk) is True
        step = WorkflowStep.objects.get(run=run)
        assert step.status == "failed" and "was cancelled" in step.error["message"]
        run = run_workflow(run.pk)
        assert run.status == "completed" and "was cancelled" in run.output["child_failed"]

    def test_an_unknown_child_workflow_is_refused_before_any_sql(self) -> None:
        ctx = RunContext(WorkflowRun.objects.create_run("test.parent"), using="default")
        with CaptureQueriesContext(connection) as queries:
            with self.assertRaisesRegex(WorkflowNotFoundError, "^workflow_name: no workflow"):
                ctx.workflow("child", "no.such.workflow")
            with self.assertRaisesRegex(InvalidArgumentError, "^input "):
                ctx.workflow("child", "test.double", {1, 2})
        assert len(queries) == 0


class IdempotentStartTests(TransactionTestCase):
    def test_a_second_start_with_a_key_returns_the_first_run_whatever_its_status(self) -> None:
        first = start_workflow("test.double", 1, idempotency_key="double-1")
        again = start_workflow("test.double", 2, idempotency_key="double-1")
        assert again.pk == first.pk and again.input == 1
        run_workflow(first.pk)
        done = start_workflow("test.double", 3, idempotency_key="double-1", inline=True)
        assert (done.pk, done.status, done.output) == (first.pk, "completed", 2)
        # Keys compare exactly (case counts), on every database.
        other = start_workflow("test.double", 1, idempotency_key="Double-1")
        assert other.pk != first.pk
        assert WorkflowRun.objects.count() == 2

    def test_a_key_of_another_workflow_is_refused(self) -> None:
        start_workflow("test.double", 1, idempotency_key="k")
        with self.assertRaisesRegex(InvalidArgumentError, "^idempotency_key 'k' already started"):
            start_workflow("test.fails", idempotency_key="k")
        with CaptureQueriesContext(connection) as queries:
            with self.assertRaisesRegex(InvalidArgumentError, "^idempotency_key "):
                start_workflow("test.double", 1, idempotency_key="")
            with self.assertRaisesRegex(InvalidArgumentError, "^timeout_ms "):
                start_workflow("test.double", 1, timeout_ms=0)
        assert len(queries) == 0


class ErrorTests(TransactionTestCase):
    def test_every_new_error_is_a_pikku_error(self) -> None:
        for cls in (SignalTimeoutError, StepFailedError, WorkflowCancelledError, WorkflowTimeoutError):
            assert issubclass(cls, PikkuError), cls
        error: Any = SignalTimeoutError("approval", 5)
        assert "approval" in str(error) and error.timeout_ms == 5
        assert "was cancelled" in str(WorkflowCancelledError("r1"))
        assert "deadline" in str(WorkflowTimeoutError("r1", 10))
