"""
Sleep, signals, child runs, idempotent start and cancel across real OS
processes: ``manage.py pikku_worker`` processes and ``python -c`` scripts
with a stdin handshake, every one bounded in time; never a fixed sleep.
"""

from __future__ import annotations

import json
import signal
from unittest import skipIf

import pytest
from django.db import connection

from pikku_django.models import Lease, WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.workflows import cancel_workflow, run_workflow, start_workflow
from testproject.testing.apps import KILL_AFTER_CHILD_START
from testproject.testing.models import StepCall
from tests.support.children import (
    finish,
    poll_until,
    read_line,
    run_script,
    send_line,
    start_script,
    subprocess_env,
)
from tests.support.workers import WorkerProcessTestCase, snapshot, status

pytestmark = pytest.mark.slow


def now_ms() -> int:
    return Lease.objects.db_now_ms()


#: Waits for "go" on stdin, then sends one signal: ``run_id name payload-json``.
SEND_SIGNAL = """
import json, sys
import django
django.setup()
from pikku_django.workflows import send_signal

run_id, name, payload = sys.argv[1:4]
print("ready", flush=True)
sys.stdin.readline()
send_signal(run_id, name, json.loads(payload))
print("sent", flush=True)
"""

#: Waits for "go" on stdin, then starts ``workflow`` under ``key`` and prints the run's id.
START_ONCE = """
import sys
import django
django.setup()
from pikku_django.workflows import start_workflow

workflow, key = sys.argv[1:3]
print("ready", flush=True)
sys.stdin.readline()
print(start_workflow(workflow, 5, idempotency_key=key).pk, flush=True)
"""

#: Under ``faketime +2h``: one ``Worker(once=True)`` batch and one direct
#: ``run_workflow`` of the sleeping run; reports its own clock beside the DB's.
SKEWED_WORKER = """
import json, sys, time
import django
django.setup()
from pikku_django.models import Lease
from pikku_django.worker import Worker
from pikku_django.workflows import run_workflow

run_id = sys.argv[1]
report = {"time_ms": int(time.time() * 1000), "db_now_ms": Lease.objects.db_now_ms()}
report["passes"] = Worker(once=True, holder="skewed").run()
run = run_workflow(run_id)
report["status"], report["wake_at"] = run.status, run.wake_at
print(json.dumps(report), flush=True)
"""


class SleepProcessTests(WorkerProcessTestCase):
    def test_a_sleeping_run_holds_no_worker_and_wakes_on_time(self) -> None:
        solo = self.worker("--holder", "solo", "--interval", "0.05")
        self.ready(solo, "solo")
        sleeper = start_workflow("test.sleeper", {"ms": 1500})
        nap = poll_until(
            lambda: WorkflowStep.objects.filter(run=sleeper, step_name="nap", status="scheduled").first(),
            timeout=60,
        )
        wake_at = nap.data["wake_at"]
        # While it sleeps, the same single worker drives another run to its end.
        other = start_workflow("test.steps", {"steps": 3})
        poll_until(lambda: status(other) == "completed", timeout=60, interval=0.05)
        other_done = StepCall.objects.get(run_id=other.pk, step="s2").at_ms
        poll_until(lambda: status(sleeper) == "completed", timeout=60, interval=0.05)

        after = StepCall.objects.get(run_id=sleeper.pk, step="after")
        print(  # noqa: T201 - reported; bounds below are generous
            f"\nsleep 1500 ms ({connection.vendor}): other run done {wake_at - other_done} ms before the "
            f"wake; step after the sleep ran {after.at_ms - wake_at} ms after it (DB clock)"
        )
        assert other_done < wake_at, "the other run had to wait for the sleeper"
        # Not early on the DB clock, and not much late either.
        assert wake_at <= after.at_ms <= wake_at + 15_000
        # The step before the sleep ran once; every body ran in the one worker.
        assert StepCall.objects.filter(run_id=sleeper.pk, step="before").count() == 1
        assert set(StepCall.objects.values_list("pid", flat=True)) == {solo.pid}
        self.stop(solo, "solo")

    @skipIf(connection.vendor == "sqlite", "on SQLite the DB clock is the process clock by design (one host)")
    def test_a_worker_two_hours_fast_does_not_wake_a_sleep_early(self) -> None:
        run = run_workflow(start_workflow("test.sleeper", {"ms": 600_000}).pk)
        wake_at = run.wake_at
        proc = run_script(SKEWED_WORKER, str(run.pk), prefix=["faketime", "-f", "+2h"])
        self.procs.append(proc)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        report = json.loads(out)
        skew = report["time_ms"] - report["db_now_ms"]
        assert abs(skew - 2 * 3_600_000) < 60_000, skew
        # Nothing was due for it, and driven directly the sleep goes on, untouched.
        assert report["passes"] == 0
        assert (report["status"], report["wake_at"]) == ("running", wake_at)
        nap = WorkflowStep.objects.get(run=run, step_name="nap")
        assert (nap.status, nap.data["wake_at"]) == ("scheduled", wake_at)
        assert not StepCall.objects.filter(run_id=run.pk, step="after").exists()


class SignalProcessTests(WorkerProcessTestCase):
    def test_six_senders_to_six_waits_each_payload_consumed_once(self) -> None:
        run = start_workflow("test.signals", {"name": "vote", "waits": 6})
        worker = self.worker("--holder", "w", "--interval", "0.05")
        self.ready(worker, "w")
        poll_until(lambda: status(run) == "suspended", timeout=60, interval=0.05)
        senders = [start_script(SEND_SIGNAL, str(run.pk), "vote", json.dumps({"from": i})) for i in range(6)]
        self.procs.extend(senders)
        for sender in senders:
            assert read_line(sender, timeout=60) == "ready\n"
        for sender in senders:
            send_line(sender, "go")
        for sender in senders:
            assert finish(sender, timeout=60) == "sent\n"
        poll_until(lambda: status(run) == "completed", timeout=60, interval=0.05)

        run.refresh_from_db()
        assert sorted(payload["from"] for payload in run.output) == list(range(6))
        signals = WorkflowSignal.objects.filter(run=run)
        assert signals.count() == 6
        consumers = list(signals.values_list("consumed_by", flat=True))
        assert None not in consumers and len(set(consumers)) == 6
        # Consumed oldest first: the output is in the order the signals were stored.
        assert run.output == list(signals.order_by("sent_at", "id").values_list("payload", flat=True))
        self.stop(worker, "w")


class ChildProcessTests(WorkerProcessTestCase):
    def test_a_worker_killed_right_after_starting_a_child_leaves_exactly_one(self) -> None:
        run = start_workflow("test.parent", {"child": "test.double", "child_input": 4})
        killed = self.worker(
            "--holder",
            "killed",
            "--interval",
            "0.05",
            env=subprocess_env(PIKKU_LEASE_TTL_MS="1500", **{KILL_AFTER_CHILD_START: "1"}),
        )
        assert killed.wait(timeout=60) == -signal.SIGKILL, self.log(killed)
        child = WorkflowRun.objects.get(parent=run)
        step = WorkflowStep.objects.get(run=run, step_name="child")
        assert (step.status, step.lease_expires_at, step.child_run_id) == ("running", None, child.pk)

        worker = self.worker(
            "--holder", "b", "--interval", "0.05", env=subprocess_env(PIKKU_LEASE_TTL_MS="1500")
        )
        self.ready(worker, "b")
        poll_until(lambda: status(run) == "completed", timeout=60, interval=0.05)
        run.refresh_from_db()
        assert run.output == {"child": 8}
        assert list(WorkflowRun.objects.filter(parent=run).values_list("pk", flat=True)) == [child.pk]
        self.stop(worker, "b")


class IdempotencyProcessTests(WorkerProcessTestCase):
    def test_five_processes_racing_one_key_get_one_run(self) -> None:
        starters = [start_script(START_ONCE, "test.double", "race-1") for _ in range(5)]
        self.procs.extend(starters)
        for starter in starters:
            assert read_line(starter, timeout=60) == "ready\n"
        for starter in starters:
            send_line(starter, "go")
        ids = {finish(starter, timeout=60).strip() for starter in starters}
        assert len(ids) == 1
        (run_id,) = ids
        assert list(WorkflowRun.objects.values_list("pk", flat=True)) == [
            WorkflowRun.objects.get(pk=run_id).pk
        ]


class CancelProcessTests(WorkerProcessTestCase):
    def test_a_step_still_running_when_its_run_is_cancelled_is_refused(self) -> None:
        release = self.tmp / "release"
        run = start_workflow("test.cancellable", {"path": str(release), "lease_ms": 1500})
        worker = self.worker("--holder", "w", "--interval", "0.05", "--max-runs", "1")
        poll_until(lambda: StepCall.objects.filter(run_id=run.pk, step="hold").exists(), timeout=60)
        cancelled_at = now_ms()
        assert cancel_workflow(run.pk) is True
        # The step's renewal answered "not yours" and set its ``cancelled``
        # event: within a third of its 1500 ms lease, with slack for a busy machine.
        noticed = poll_until(
            lambda: StepCall.objects.filter(run_id=run.pk, step="noticed").first(), timeout=30, interval=0.05
        )
        print(f"\ncancel noticed by the step after {noticed.at_ms - cancelled_at} ms (DB clock)")  # noqa: T201
        assert noticed.at_ms - cancelled_at <= 10_000
        before = snapshot(run)
        release.touch()
        code, _ = self.exits(worker, timeout=60)
        assert code == 0, self.log(worker)
        assert "superseded" in self.log(worker)
        # The late result changed no row, and no later step started.
        assert snapshot(run) == before
        assert status(run) == "cancelled"
        assert not StepCall.objects.filter(run_id=run.pk, step="after").exists()
        step = WorkflowStep.objects.get(run=run, step_name="hold")
        assert (step.status, step.result) == ("failed", None)
