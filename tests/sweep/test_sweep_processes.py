"""
Real ``manage.py pikku_sweep`` and ``manage.py pikku_worker`` processes on the
live test database: a worker SIGKILLed mid-step is recovered by the sweep once
its step lease lapses (and not before), a step that kills every worker is
failed by the sweep and its run by the next worker pass, two sweeps at once
wake each stalled run once, and bad options exit 2 while ``--dry-run`` changes
no row. (Recovery behind a backlog: test_recovery_processes.py.)

Every process is bounded in time and killed in tearDown. The tests wait on a
"ready" or "warm" line, on the database (a poll with a deadline), or on a
process's exit; never on a fixed sleep. Times are taken on the database clock.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from pikku_django.managers import WOKEN
from pikku_django.models import Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep
from pikku_django.sweep import PRUNE_GRACE_MS
from pikku_django.workflows import start_workflow
from tests.support.children import poll_until, subprocess_env
from tests.support.command_line import from_the_command_line
from tests.support.factories import lapse
from tests.support.processes import (
    LONG_RUN_LEASE_MS,
    RECLAIM_WITHIN_S,
    STEP_LEASE_MS,
    ProcessTestCase,
    attempts,
    calls,
    epoch_ms,
    everything,
    idle_runs,
    now_ms,
    rows_of,
    run_lease_state,
    running_at,
    status,
)

pytestmark = pytest.mark.slow


#: The step lease of the test whose early sweep and worker must both have
#: ended while it is live: long enough for two process passes on a busy machine.
EARLY_LEASE_MS = 2 * STEP_LEASE_MS
#: Its kill -> attempt 2 bound: the other tests' (RECLAIM_WITHIN_S) for its longer lease.
EARLY_RECLAIM_WITHIN_S = RECLAIM_WITHIN_S + (EARLY_LEASE_MS - STEP_LEASE_MS) / 1000


class KilledWorkerTests(ProcessTestCase):
    def test_sweep_wakes_a_killed_workers_run_once_its_step_lease_lapses(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        run = start_workflow("test.blocker", {"lease_ms": EARLY_LEASE_MS})
        # Made ready beforehand, so they run while the step lease is surely live.
        early_sweep = self.command("pikku_sweep", "--json", warm=True, env=env)
        early_worker = self.command("pikku_worker", "--once", "--holder", "worker-early", warm=True, env=env)
        # And those that follow the lapse, so that no process start is measured.
        late_sweep = self.command("pikku_sweep", "--json", warm=True, env=env)
        b = self.command(
            "pikku_worker",
            "--holder",
            "worker-b",
            "--concurrency",
            "1",
            "--no-sweep",
            "--interval",
            "0.1",
            warm=True,
            env=env,
        )
        a = self.worker("worker-a", "--interval", "0.1", env=env)
        _, kill_ms = self.killed_mid_step(run, a)
        killed = time.monotonic()
        step = WorkflowStep.objects.get(run=run, step_name="block")
        assert (step.status, step.attempt) == ("running", 1)
        lease_until = step.lease_expires_at
        wake_at = WorkflowRun.objects.values_list("wake_at", flat=True).get(pk=run.pk)

        # While the dead worker's step lease is live, neither a sweep nor a
        # worker touches the run.
        self.go(early_sweep)
        self.go(early_worker)
        early = json.loads(self.line(early_sweep, timeout=30))
        assert self.exits(early_sweep)[0] == 0, self.log(early_sweep)
        code, out = self.exits(early_worker)
        checked_ms = now_ms()
        assert checked_ms < lease_until, (
            f"the checks ran {checked_ms - lease_until} ms after the lease lapsed"
        )
        assert code == 0, self.log(early_worker)
        assert out == "pikku_worker worker-early ready\npikku_worker worker-early stopped after 0 passes\n"
        assert (early["lapsed_runs"], early["woken_runs"], early["failed_steps"]) == (0, 0, 0), early
        assert WorkflowRun.objects.values_list("wake_at", flat=True).get(pk=run.pk) == wake_at
        assert calls(run, "block") == [a.pid]
        assert attempts(step) == [(1, "running")]

        # Once the lease has lapsed on the database clock, the next sweep wakes the run.
        poll_until(lambda: now_ms() >= lease_until, timeout=EARLY_RECLAIM_WITHIN_S, interval=0.05)
        self.go(late_sweep)
        report = json.loads(self.line(late_sweep, timeout=30))
        ended_ms = now_ms()
        assert self.exits(late_sweep)[0] == 0, self.log(late_sweep)
        assert (report["lapsed_runs"], report["woken_runs"], report["failed_steps"]) == (1, 1, 0), report
        woken = WorkflowRun.objects.get(pk=run.pk)
        assert (woken.wake_at, woken.sweep_wakes) == (WOKEN, 1)

        # A second worker takes the step again, as attempt 2, and completes the run.
        self.go(b)
        assert self.line(b, timeout=30) == "pikku_worker worker-b ready\n"
        try:
            reclaimed = poll_until(
                lambda: running_at(step, 2),
                timeout=max(EARLY_RECLAIM_WITHIN_S - (time.monotonic() - killed), 0),
            )
        except AssertionError:
            raise AssertionError(
                f"attempt 2 not claimed within {EARLY_RECLAIM_WITHIN_S} s of the kill, though the sweep woke "
                f"the run {ended_ms - kill_ms} ms after it: {run_lease_state(run)}"
            ) from None
        poll_until(lambda: status(run) != "running", timeout=30, interval=0.05)
        run.refresh_from_db()
        assert (run.status, run.output, run.error) == ("completed", {"block": {"call": 2}}, None)
        step.refresh_from_db()
        assert (step.status, step.attempt, step.result) == ("succeeded", 2, {"call": 2})
        assert attempts(step) == [(1, "running"), (2, "succeeded")]
        assert calls(run, "block") == [a.pid, b.pid]
        self.stop(b, "worker-b")

        print(  # noqa: T201 - measured, reported
            f"\nsweep recovery ({run._state.db}, step lease {EARLY_LEASE_MS} ms, "
            f"run lease {LONG_RUN_LEASE_MS} ms): "
            f"lease lapsed {lease_until - kill_ms} ms after the kill; woken by the sweep at "
            f"+{ended_ms - kill_ms} ms; attempt 2 claimed at +{epoch_ms(reclaimed) - kill_ms} ms (DB clock)"
        )

    def test_woken_run_waits_for_a_live_step_lease(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        run = start_workflow("test.blocker", {"lease_ms": STEP_LEASE_MS})
        early_worker = self.command("pikku_worker", "--once", "--holder", "worker-early", warm=True, env=env)
        a = self.worker("worker-a", "--interval", "0.1", env=env)
        _, kill_ms = self.killed_mid_step(run, a)
        step = WorkflowStep.objects.get(run=run, step_name="block")
        lease_until = step.lease_expires_at

        # Free the run itself (its lease gone, woken, as the admin could): a
        # worker drives it, but leaves the step alone while its lease is live.
        Lease.objects.filter(key=run.lease_key).expire()
        assert WorkflowRun.objects.filter(pk=run.pk).wake() == 1
        self.go(early_worker)
        code, out = self.exits(early_worker)
        checked_ms = now_ms()
        assert checked_ms < lease_until, (
            f"the worker ran {checked_ms - lease_until} ms after the lease lapsed"
        )
        assert code == 0, self.log(early_worker)
        assert out == "pikku_worker worker-early ready\npikku_worker worker-early stopped after 1 passes\n"
        assert calls(run, "block") == [a.pid]
        assert attempts(step) == [(1, "running")]
        # It suspended the run until the step lease lapses.
        assert WorkflowRun.objects.values_list("status", "wake_at").get(pk=run.pk) == ("running", lease_until)

        # Once it has lapsed, the run is due again and the next worker finishes it.
        poll_until(lambda: WorkflowRun.objects.due().filter(pk=run.pk).exists(), timeout=10, interval=0.05)
        b = self.worker("worker-b", "--once", env=env)
        assert self.exits(b)[0] == 0, self.log(b)
        run.refresh_from_db()
        assert (run.status, run.output) == ("completed", {"block": {"call": 2}})
        assert calls(run, "block") == [a.pid, b.pid]
        reclaimed = running_at(step, 2)
        assert reclaimed is not None and epoch_ms(reclaimed) >= lease_until
        print(  # noqa: T201 - measured, reported
            f"\nlive step lease ({run._state.db}): lapsed {lease_until - kill_ms} ms after the kill; "
            f"attempt 2 claimed at +{epoch_ms(reclaimed) - kill_ms} ms (DB clock)"
        )

    def test_step_that_kills_every_worker_is_failed_by_the_sweep(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS="1000")
        run = start_workflow("test.killer", {"lease_ms": 1000})
        pids = []
        # One worker after another dies in the step: attempts 1 and 2.
        for i in range(2):
            proc = self.worker(f"worker-{i}", "--interval", "0.1", env=env)
            pids.append(proc.pid)
            assert proc.wait(timeout=30) == -signal.SIGKILL, self.log(proc)
        step = WorkflowStep.objects.get(run=run, step_name="kill")
        assert (step.status, step.attempt, step.retries) == ("running", 2, 1)
        assert calls(run, "kill") == pids

        # With no worker left, the sweep fails the step once its lease lapses.
        poll_until(
            lambda: WorkflowStep.objects.lapsed().filter(pk=step.pk).exists(), timeout=10, interval=0.05
        )
        report = self.sweep(env=env)
        assert report["failed_steps"] == 1, report
        step.refresh_from_db()
        assert (step.status, step.attempt, step.lease_expires_at) == ("failed", 2, None)
        assert "lost its worker" in step.error["message"], step.error
        assert attempts(step) == [(1, "running"), (2, "failed")]
        # The run is woken, still running: failing it is a worker pass's job.
        assert WorkflowRun.objects.values_list("status", "wake_at").get(pk=run.pk) == ("running", WOKEN)

        last = self.worker("worker-last", "--interval", "0.1", env=env)
        poll_until(lambda: status(run) != "running", timeout=30, interval=0.05)
        self.stop(last, "worker-last")
        run.refresh_from_db()
        assert (run.status, run.wake_at, run.error["step"]) == ("failed", None, "kill")
        assert "lost its worker" in run.error["message"], run.error

        # No third attempt ever starts: not by a sweep, nor by a worker.
        before = rows_of(run)
        report = self.sweep(env=env)
        assert (report["failed_steps"], report["woken_runs"]) == (0, 0), report
        once = self.worker("worker-after", "--once", env=env)
        assert self.exits(once) == (0, "pikku_worker worker-after stopped after 0 passes\n"), self.log(once)
        assert rows_of(run) == before
        assert calls(run, "kill") == pids


class ConcurrentSweepTests(ProcessTestCase):
    RUNS = 20
    ROUNDS = 10

    def test_two_sweeps_at_once_wake_each_stalled_run_once(self) -> None:
        ids = idle_runs(self.RUNS, idle_ms=120_000)
        runs = WorkflowRun.objects.filter(pk__in=ids)
        # Both set up and waiting, then told to go in the same instant, round
        # after round; the first round finds no token floor row yet, as on a
        # fresh database, so both prunes create it at once.
        sweeps = [self.command("pikku_sweep", "--json", "--stalled-after", "60", warm=True) for _ in range(2)]
        split = []
        for i in range(self.ROUNDS):
            # Every run stalled and never swept.
            runs.update(wake_at=None, swept_at=None, sweep_wakes=0, sweep_after=None)
            for proc in sweeps:
                self.go(proc)
            reports = [json.loads(self.line(proc, timeout=60)) for proc in sweeps]
            woken = [r["woken_runs"] for r in reports]
            assert sum(woken) == self.RUNS, (i, reports)
            for r in reports:
                assert r["stalled_runs"] - r["woken_runs"] == r["backed_off_runs"], (i, reports)
                assert r["failed_steps"] == 0, (i, reports)
            assert sorted(runs.values_list("sweep_wakes", flat=True)) == [1] * self.RUNS, i
            assert sorted(runs.values_list("wake_at", flat=True)) == [WOKEN] * self.RUNS, i
            split.append(tuple(woken))
        for proc in sweeps:
            assert self.exits(proc)[0] == 0, self.log(proc)
        both = sum(1 for a, b in split if a and b)
        print(  # noqa: T201 - measured, reported
            f"\ntwo sweeps at once ({runs.db}, {self.RUNS} stalled runs): woken per round {split}; "
            f"{both}/{self.ROUNDS} rounds split between the two"
        )


class CommandLineTests(ProcessTestCase):
    def test_bad_options_exit_2_with_the_usage(self) -> None:
        bad = [
            ("--stalled-after", "-1"),
            ("--stalled-after", "soon"),
            ("--stalled-after", "inf"),
            ("--limit", "0"),
            ("--interval", "0"),
        ]
        # One in a process of its own; each of them through manage.py's own
        # entry point in this one (a process start-up costs most of a second).
        proc = self.command("pikku_sweep", *bad[0])
        code, out = self.exits(proc)
        assert (code, out) == (2, ""), self.log(proc)
        assert self.log(proc).startswith("usage: manage.py pikku_sweep "), self.log(proc)
        for option, value in bad:
            code, out, err = from_the_command_line("pikku_sweep", option, value)
            assert (code, out) == (2, ""), (option, value, code, err)
            assert err.startswith("usage: manage.py pikku_sweep "), err
            # The error line names the option and the value refused.
            assert f"pikku_sweep: error: argument {option}: {value!r} " in err, err

    def sweepable(self) -> WorkflowStep:
        """Two stalled runs, a spent step whose worker is gone, a prunable lease; returns the step."""
        idle_runs(2, idle_ms=120_000)
        spent = start_workflow("test.steps", {"steps": 1})
        step = WorkflowStep.objects.insert_step(
            spent, "s0", "testproject.testing.workflows.plain_step", retries=0
        )
        WorkflowStep.objects.claim(spent.pk, "s0", step.rpc_name, 60_000)
        WorkflowStep.objects.filter(pk=step.pk).update(lease_expires_at=now_ms() - 1)
        # A lease lapsed for eight days, under a token floor that has stood.
        Lease.objects.acquire("old", "someone", 60_000)
        lapse("old", ago_ms=8 * 24 * 3600 * 1000)
        LeaseTokenFloor.objects.create(pk=1, token=1, raised_at=now_ms() - PRUNE_GRACE_MS - 1)
        return step

    def test_dry_run_json_changes_no_row(self) -> None:
        step = self.sweepable()
        before = everything()
        dry = self.sweep("--dry-run", "--stalled-after", "60")
        assert everything() == before
        assert dry["dry_run"] is True
        assert (dry["failed_steps"], dry["stalled_runs"], dry["pruned_leases"]) == (1, 2, 1), dry
        assert set(dry) == {
            "dry_run",
            "failed_steps",
            "timed_out_runs",
            "lapsed_runs",
            "stalled_runs",
            "undispatched_runs",
            "woken_runs",
            "backed_off_runs",
            "signalled_runs",
            "pruned_leases",
            "pruned_runs",
            "pruned_minutes",
            "duration_ms",
        }
        # A real pass changes them.
        done = self.sweep("--stalled-after", "60")
        assert done["dry_run"] is False
        assert (done["failed_steps"], done["stalled_runs"], done["pruned_leases"]) == (1, 2, 1), done
        assert WorkflowStep.objects.values_list("status", flat=True).get(pk=step.pk) == "failed"
        assert not Lease.objects.filter(key="old").exists()

    def test_dry_run_reports_what_a_real_pass_then_does(self) -> None:
        self.sweepable()
        dry = self.sweep("--dry-run", "--stalled-after", "60")
        done = self.sweep("--stalled-after", "60")
        counts = [key for key in dry if key not in ("dry_run", "duration_ms")]
        assert {k: dry[k] for k in counts} == {k: done[k] for k in counts}, (dry, done)
