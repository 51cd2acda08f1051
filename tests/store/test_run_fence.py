"""
The run lease fences the run: a pass that lost it writes no run row and no
new step; two passes meeting one new wait end in replay; store errors never
reach workflow code; whatever a step raises is its attempt's error.

Two passes are two threads, each on its own connection to the test
database, stopped at a chosen point by an event handshake.
"""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import sweep
from pikku_django.workflows import run_workflow, runner, send_signal, start_workflow, workflow
from pikku_django.workflows.waits import SLEEP_RPC
from tests.support.factories import lapse, lapse_step
from tests.support.threads import in_thread

#: Threads (by name) that stop at ``gate()`` until released.
GATED: dict[str, tuple[threading.Event, threading.Event]] = {}


def gate(point: str) -> None:
    """Stop this thread at ``point`` if the test gated it there: say so, wait for the release."""
    entry = GATED.get(f"{threading.current_thread().name}:{point}")
    if entry is not None:
        reached, release = entry
        reached.set()
        assert release.wait(30), f"{point} was never released"


def gated(thread: str, point: str) -> tuple[threading.Event, threading.Event]:
    entry = GATED[f"{thread}:{point}"] = (threading.Event(), threading.Event())
    return entry


def gate_step(name: str) -> str:
    gate(name)
    return name


@workflow("fence.wait_then_step")
def wait_then_step(ctx: Any, input: Any) -> Any:
    go = ctx.wait_for_signal("go")
    return {"go": go, "after": ctx.step("after", gate_step, "after")}


@workflow("fence.gate_then_sleep")
def gate_then_sleep(ctx: Any, input: Any) -> Any:
    gate("before-sleep")
    ctx.sleep("nap", 60_000)
    return "woke"


def break_the_store(broken: bool) -> None:
    """Make the store's next attempt-history write fail (or mend it): a rename, or on SQLite a trigger."""
    table = WorkflowStepAttempt._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            # There a missing table is an OperationalError (an outage): a
            # trigger that refuses the history row fails the write instead.
            cursor.execute(
                f"CREATE TRIGGER pikku_broken BEFORE INSERT ON {table} "
                "BEGIN SELECT RAISE(ABORT, 'the store is broken'); END"
                if broken
                else "DROP TRIGGER pikku_broken"
            )
            return
        old, new = (table, "pikku_attempt_away")
        cursor.execute(
            f"ALTER TABLE {old} RENAME TO {new}" if broken else f"ALTER TABLE {new} RENAME TO {old}"
        )


def charge_then_break_the_store() -> str:
    break_the_store(True)
    return "charged"


@workflow("fence.catches_everything")
def catches_everything(ctx: Any, input: Any) -> Any:
    try:
        ctx.step("charge", charge_then_break_the_store)
    except Exception:
        return "not charged"
    return "charged"


def exits() -> None:
    raise SystemExit(3)


def interrupts() -> None:
    raise KeyboardInterrupt


@workflow("fence.exits")
def exiting(ctx: Any, input: Any) -> Any:
    return ctx.step("bye", exits if input == "exit" else interrupts)


class RunFenceTests(TransactionTestCase):
    def tearDown(self) -> None:
        for _, release in GATED.values():
            release.set()
        GATED.clear()

    def test_a_pass_that_lost_its_run_lease_writes_no_suspension(self) -> None:
        run = start_workflow("fence.wait_then_step")
        suspending, resume = gated("A", "suspend")
        real = runner.suspend_run

        def paused(*args: Any, **kwargs: Any) -> None:
            gate("suspend")
            real(*args, **kwargs)

        with mock.patch.object(runner, "suspend_run", paused):
            a = in_thread("A", lambda: run_workflow(run.pk, holder="A"))
            assert suspending.wait(30)
            # A found no signal and is about to suspend, paused past its lease.
            lapse(run.lease_key)
            send_signal(run.pk, "go", {"ok": 1})
            in_step, finish = gated("B", "after")
            b = in_thread("B", lambda: run_workflow(run.pk, holder="B"))
            assert in_step.wait(30)
            resume.set()
            a.join(30)
            # A's suspension was fenced out: B still drives a running run.
            assert WorkflowRun.objects.get(pk=run.pk).status == "running"
            finish.set()
            b.join(30)
        run.refresh_from_db()
        assert (run.status, run.output) == ("completed", {"go": {"ok": 1}, "after": "after"})

    def test_a_stale_pass_creates_no_sleep_step(self) -> None:
        run = start_workflow("fence.gate_then_sleep")
        at_gate, release = gated("A", "before-sleep")
        a = in_thread("A", lambda: run_workflow(run.pk, holder="A"))
        assert at_gate.wait(30)
        lapse(run.lease_key)
        run_workflow(run.pk, holder="B")
        nap = WorkflowStep.objects.get(run=run, step_name="nap")
        run.refresh_from_db()
        assert (run.status, run.wake_at) == ("running", nap.data["wake_at"])
        release.set()
        a.join(30)
        # A met a step it had not seen, under a lease it no longer holds: it wrote nothing.
        run.refresh_from_db()
        assert (run.status, run.wake_at, run.error) == ("running", nap.data["wake_at"], None)
        assert list(WorkflowStep.objects.filter(run=run).values_list("step_name", "attempt")) == [("nap", 1)]

    def test_a_wait_step_created_by_another_pass_is_replayed(self) -> None:
        run = start_workflow("fence.gate_then_sleep")
        at_gate, release = gated("B", "before-sleep")
        b = in_thread("B", lambda: run_workflow(run.pk, holder="B"))
        assert at_gate.wait(30)
        # Another pass created the sleep after B read the run's steps.
        wake_at = Lease.objects.db_now_ms() + 120_000
        step = WorkflowStep.objects.insert_step(run, "nap", SLEEP_RPC, {"ms": 120_000, "wake_at": wake_at})
        WorkflowStep.objects.filter(pk=step.pk).update(status="scheduled")
        release.set()
        b.join(30)
        run.refresh_from_db()
        assert (run.status, run.wake_at, run.error) == ("running", wake_at, None)


class StoreErrorTests(TransactionTestCase):
    def test_a_store_error_is_never_caught_by_the_workflow(self) -> None:
        run = start_workflow("fence.catches_everything")
        try:
            run = run_workflow(run.pk)
        finally:
            break_the_store(False)
        # Not the workflow's "not charged" branch: the run fails, naming the store's error.
        assert (run.status, run.output) == ("failed", None)
        assert run.error["type"] == "pikku_django.errors.RunStoreError"
        assert "the workflow store failed" in run.error["message"]

    def test_system_exit_and_keyboard_interrupt_in_a_step_are_its_error(self) -> None:
        for how, kind in [("exit", "builtins.SystemExit"), ("interrupt", "builtins.KeyboardInterrupt")]:
            run = run_workflow(start_workflow("fence.exits", how).pk)
            assert run.status == "failed"
            step = WorkflowStep.objects.get(run=run)
            assert (step.status, step.error["type"]) == ("failed", kind)
            assert run.error["step"] == "bye"


class SweepFenceTests(TransactionTestCase):
    """The sweep lapses a run lease only when the pass behind it is dead."""

    def run_with_lapsed_step(self, step_holder: str) -> WorkflowRun:
        run = start_workflow("fence.gate_then_sleep")
        step = WorkflowStep.objects.start_step(run.pk, "old", "x.old", 1_000, holder=step_holder)
        assert step is not None
        lapse_step(step)
        assert Lease.objects.acquire(run.lease_key, "live-pass", 60_000) is not None
        return run

    def test_a_lapsed_step_of_an_earlier_pass_leaves_the_live_pass_its_lease(self) -> None:
        run = self.run_with_lapsed_step("dead-pass")
        report = sweep()
        assert report.lapsed_runs == 1
        assert Lease.objects.current(run.lease_key).holder == "live-pass"

    def test_a_lapsed_step_of_the_lease_holder_frees_the_run(self) -> None:
        run = self.run_with_lapsed_step("live-pass")
        sweep()
        assert Lease.objects.current(run.lease_key) is None
