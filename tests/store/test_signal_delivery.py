"""
A signal is stored and its run woken in one commit: a sender that dies
between the two leaves neither, a retry with its ``idempotency_key`` stores
one signal, and the sweep wakes a suspended run whose signal is stored but
whose wake never came. Senders and sweeps run as real OS processes.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.sweep import sweep
from pikku_django.workflows import run_workflow, send_signal, start_workflow
from tests.support.children import finish, read_line, send_line, start_script
from tests.support.processes import ProcessTestCase, now_ms

pytestmark = pytest.mark.slow

#: Sends one signal, and dies (``os._exit``, no commit, no rollback sent)
#: between its two writes: the store and the wake, in whichever order.
DIE_BETWEEN = """
import os, sys
import django
django.setup()
from django.db import connection
from pikku_django.workflows import send_signal

run_id, name = sys.argv[1:3]
written = set()

def die_between(execute, sql, params, many, context):
    head = sql.lstrip().upper()
    store = head.startswith("INSERT") and "pikku_workflow_signal" in sql
    wake = head.startswith("UPDATE") and "pikku_workflow_run" in sql
    if store or wake:
        written.add("store" if store else "wake")
        if written == {"store", "wake"}:
            print("dying", flush=True)
            os._exit(3)
    return execute(sql, params, many, context)

print("ready", flush=True)
sys.stdin.readline()
with connection.execute_wrapper(die_between):
    send_signal(run_id, name, "lost?", idempotency_key="k-1")
print("sent", flush=True)
"""

#: Waits for "go", then sends one signal under a key; prints the signal's id.
SEND_WITH_KEY = """
import sys
import django
django.setup()
from pikku_django.workflows import send_signal

run_id, name, key = sys.argv[1:4]
print("ready", flush=True)
sys.stdin.readline()
print(send_signal(run_id, name, key, idempotency_key=key).pk, flush=True)
"""


def waiting_run(name: str = "approval") -> WorkflowRun:
    """A run suspended on ``ctx.wait_for_signal(name)``, holding no worker."""
    run = run_workflow(start_workflow("test.signals", {"name": name, "waits": 1}).pk)
    assert (run.status, run.wake_at) == ("suspended", None)
    return run


def stored_without_wake(run: WorkflowRun, name: str = "approval", payload: object = "late") -> None:
    """A signal stored and its wake lost, as a sender of two commits could leave it."""
    WorkflowSignal.objects.create(run=run, name=name, payload=payload, sent_at=now_ms())


def status(run: WorkflowRun) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(pk=run.pk)


class OneCommitTests(ProcessTestCase):
    def test_a_sender_that_dies_between_store_and_wake_leaves_neither(self) -> None:
        run = waiting_run()
        sender = start_script(DIE_BETWEEN, str(run.pk), "approval")
        self.procs.append(sender)
        assert read_line(sender, timeout=60) == "ready\n"
        send_line(sender, "go")
        assert read_line(sender, timeout=60) == "dying\n"
        assert sender.wait(timeout=30) == 3
        # The store died with the wake: no signal the run would never be woken
        # for, and nothing a retry would double.
        assert not WorkflowSignal.objects.filter(run=run).exists()
        assert status(run) == "suspended"
        # The caller's retry with its key stores the one signal, and wakes the run.
        send_signal(run.pk, "approval", "again", idempotency_key="k-1")
        assert WorkflowSignal.objects.filter(run=run).count() == 1
        assert status(run) == "running"
        assert run_workflow(run.pk).output == ["again"]

    def test_two_senders_racing_with_one_key_store_one_signal(self) -> None:
        run = waiting_run()
        senders = [start_script(SEND_WITH_KEY, str(run.pk), "approval", "once") for _ in range(2)]
        self.procs.extend(senders)
        for sender in senders:
            assert read_line(sender, timeout=60) == "ready\n"
        for sender in senders:
            send_line(sender, "go")
        ids = {int(finish(sender, timeout=60).strip()) for sender in senders}
        (signal,) = WorkflowSignal.objects.filter(run=run)
        assert ids == {signal.pk}
        assert run_workflow(run.pk).output == ["once"]


class IdempotencyTests(TransactionTestCase):
    def test_a_second_send_with_the_key_returns_the_first_signal_and_stores_nothing(self) -> None:
        run = start_workflow("test.signals", {"name": "tick", "waits": 2})
        first = send_signal(run.pk, "tick", 1, idempotency_key="a")
        again = send_signal(run.pk, "tick", 2, idempotency_key="a")
        assert (again.pk, again.payload, again.idempotency_key) == (first.pk, 1, "a")
        other = send_signal(run.pk, "tick", 3, idempotency_key="b")
        assert WorkflowSignal.objects.filter(run=run).count() == 2
        # The key is the run's own: another run may use it.
        elsewhere = start_workflow("test.signals", {"name": "tick", "waits": 1})
        assert send_signal(elsewhere.pk, "tick", 4, idempotency_key="a").pk not in {first.pk, other.pk}
        # Unkeyed sends are never merged.
        send_signal(elsewhere.pk, "tick", 5)
        send_signal(elsewhere.pk, "tick", 5)
        assert WorkflowSignal.objects.filter(run=elsewhere).count() == 3
        assert run_workflow(run.pk).output == [1, 3]

    def test_a_key_of_another_signal_is_refused_and_bad_keys_before_any_sql(self) -> None:
        run = start_workflow("test.signals", {"name": "tick", "waits": 1})
        send_signal(run.pk, "tick", idempotency_key="a")
        with pytest.raises(InvalidArgumentError, match="idempotency_key 'a' already sent the signal 'tick'"):
            send_signal(run.pk, "tock", idempotency_key="a")
        for bad in ["", "x" * 256, 7, "a\x00b"]:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="idempotency_key"):
                send_signal(run.pk, "tick", idempotency_key=bad)  # type: ignore[arg-type]
        assert WorkflowSignal.objects.count() == 1

    def test_a_send_inside_a_rolled_back_atomic_stores_and_wakes_nothing(self) -> None:
        run = waiting_run()
        with pytest.raises(RuntimeError), transaction.atomic():
            send_signal(run.pk, "approval", "x", idempotency_key="k")
            assert status(run) == "running"
            raise RuntimeError("roll back")
        assert not WorkflowSignal.objects.exists()
        assert status(run) == "suspended"
        # A replayed key inside the caller's transaction leaves it usable.
        with transaction.atomic():
            first = send_signal(run.pk, "approval", "x", idempotency_key="k")
            assert send_signal(run.pk, "approval", "y", idempotency_key="k").pk == first.pk
            assert WorkflowRun.objects.filter(pk=run.pk).exists()
        assert run_workflow(run.pk).output == ["x"]


class SweepWakesSignalledRunsTests(TransactionTestCase):
    def test_a_suspended_run_whose_signal_is_waiting_is_woken_by_the_sweep(self) -> None:
        run = waiting_run()
        stored_without_wake(run)
        # Not woken by anything else, however long it waits.
        assert not WorkflowRun.objects.due().filter(pk=run.pk).exists()
        dry = sweep(dry_run=True)
        assert dry.signalled_runs == 1 and status(run) == "suspended"
        report = sweep()
        assert report.signalled_runs == 1
        assert "woke 1 suspended runs whose signal was waiting" in report.summary()
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()
        assert run_workflow(run.pk).output == ["late"]
        assert sweep().signalled_runs == 0

    def test_only_a_signal_for_the_wait_the_run_is_in_wakes_it(self) -> None:
        other_name = waiting_run()
        stored_without_wake(other_name, name="other")
        consumed = waiting_run()
        stored_without_wake(consumed)
        step = WorkflowStep.objects.get(run=consumed)
        WorkflowSignal.objects.filter(run=consumed).update(consumed_by=step, consumed_at=now_ms())
        # A running run with a stored signal is due already, or its pass will see it.
        running = start_workflow("test.signals", {"name": "approval", "waits": 1})
        stored_without_wake(running)
        assert sweep().signalled_runs == 0
        assert {status(r) for r in (other_name, consumed)} == {"suspended"}

    def test_a_wait_with_a_timeout_is_woken_at_once_too_and_the_limit_holds(self) -> None:
        waits = {"name": "go", "waits": 1, "timeout_ms": 3_600_000}
        runs = [run_workflow(start_workflow("test.signals", waits).pk) for _ in range(3)]
        for run in runs:
            assert run.status == "suspended" and run.wake_at is not None
            stored_without_wake(run, name="go")
        assert sweep(limit=2).signalled_runs == 2
        assert sweep(limit=2).signalled_runs == 1
        assert {run_workflow(run.pk).status for run in runs} == {"completed"}


class SweepProcessTests(ProcessTestCase):
    def test_pikku_sweep_wakes_a_lost_wake_and_a_worker_finishes_the_run(self) -> None:
        run = waiting_run()
        stored_without_wake(run, payload={"by": "ana"})
        report = self.sweep()
        assert report["signalled_runs"] == 1, report
        proc = self.worker("sweep-signal-worker", "--once")
        code, _ = self.exits(proc)
        assert code == 0, self.log(proc)
        done = WorkflowRun.objects.get(pk=run.pk)
        assert (done.status, done.output) == ("completed", [{"by": "ana"}])
