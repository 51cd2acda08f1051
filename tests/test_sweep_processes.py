"""
Real ``manage.py pikku_sweep`` and ``manage.py pikku_worker`` processes on the
live test database: a worker SIGKILLed mid-step is recovered by the sweep once
its step lease lapses (and not before), a step that kills every worker is
failed by the sweep and its run by the next worker pass, a killed step is
taken again promptly even behind a backlog of fresh work, two sweeps at once
wake each stalled run once, and bad options exit 2 while ``--dry-run`` changes
no row.

Every process is bounded in time and killed in tearDown. The tests wait on a
"ready" or "warm" line, on the database (a poll with a deadline), or on a
process's exit; never on a fixed sleep. Times are taken on the database clock.
"""

from __future__ import annotations

import datetime
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.test import TransactionTestCase

from pikku_django.managers import WOKEN
from pikku_django.models import Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import PRUNE_GRACE_MS
from pikku_django.workflows import start_workflow
from testproject.testing.models import PassRecord, StepCall
from tests.conftest import ROOT, kill_all, lapse, poll_until, read_line, send_line, subprocess_env

pytestmark = pytest.mark.slow

#: The step lease of the step a worker is killed in.
STEP_LEASE_MS = 3_000
#: The workers' run lease ttl: far longer than the step lease, so that a dead
#: worker's run is not due again on its own soon; only the sweep recovers it.
LONG_RUN_LEASE_MS = "60000"
#: A killed step must be taken again within its step lease + the sweep
#: interval + a few seconds of the kill.
RECLAIM_WITHIN_S = 10.0

#: ``python -c WARM command args…``: sets Django up, says "warm", then runs
#: ``manage.py command args…`` once per "go" line on stdin. A command started
#: this way is ready to run the moment it is told, so two of them run at once
#: and a check right after a kill is not late by a process start.
WARM = """
import importlib, sys
import django
django.setup()
from django.core.management import execute_from_command_line
importlib.import_module("pikku_django.management.commands." + sys.argv[1])
print("warm", flush=True)
for line in sys.stdin:
    if line.strip() != "go":
        break
    execute_from_command_line(["manage.py", *sys.argv[1:]])
    sys.stdout.flush()
"""


def epoch_ms(value: datetime.datetime) -> int:
    return int(value.timestamp() * 1000)


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def status(run: WorkflowRun) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(pk=run.pk)


def calls(run: WorkflowRun, step: str) -> list[int]:
    """The pids that ran the step's body, in order."""
    return list(
        StepCall.objects.filter(run_id=run.pk, step=step)
        .order_by("at_ms", "pk")
        .values_list("pid", flat=True)
    )


def attempts(step: WorkflowStep) -> list[tuple[int, str]]:
    return list(
        WorkflowStepAttempt.objects.filter(step=step).order_by("attempt").values_list("attempt", "status")
    )


def running_at(step: WorkflowStep, attempt: int) -> datetime.datetime | None:
    """When ``attempt`` of the step was claimed (DB clock), or None before."""
    return (
        WorkflowStepAttempt.objects.filter(step=step, attempt=attempt, running_at__isnull=False)
        .values_list("running_at", flat=True)
        .first()
    )


def everything() -> list[list[dict[str, Any]]]:
    """Every row of every table a sweep could touch, and the test app's."""
    return [
        list(model.objects.order_by("pk").values())
        for model in (
            Lease,
            LeaseTokenFloor,
            WorkflowRun,
            WorkflowStep,
            WorkflowStepAttempt,
            StepCall,
            PassRecord,
        )
    ]


def rows_of(run: WorkflowRun) -> list[list[dict[str, Any]]]:
    """Every row the runtime keeps for ``run``, to prove that nothing changed."""
    return [
        list(WorkflowRun.objects.filter(pk=run.pk).values()),
        list(WorkflowStep.objects.filter(run=run).order_by("step_name").values()),
        list(
            WorkflowStepAttempt.objects.filter(step__run=run).order_by("step__step_name", "attempt").values()
        ),
        list(StepCall.objects.filter(run_id=run.pk).order_by("pk").values()),
    ]


def run_lease_state(run: WorkflowRun) -> str:
    """Why a woken run may still not be driven: its lease and its wake time, now."""
    now = now_ms()
    lease = Lease.objects.filter(key=run.lease_key).values("holder", "token", "expires_at").first()
    row = WorkflowRun.objects.values("status", "wake_at", "sweep_wakes", "sweep_after").get(pk=run.pk)
    held = (
        "no run lease row"
        if lease is None
        else f"run lease held by {lease['holder']!r} (token {lease['token']}) "
        f"for {lease['expires_at'] - now} ms more"
    )
    wake = "None" if row["wake_at"] is None else f"{row['wake_at'] - now:+d} ms from now"
    return f"{held}; run {row['status']}, wake_at {wake}, sweep_wakes {row['sweep_wakes']}"


def idle_runs(n: int, idle_ms: int) -> list[Any]:
    """``n`` running runs, not due, each with one pending step, untouched for ``idle_ms``."""
    ids = []
    for _ in range(n):
        run = WorkflowRun.objects.create_run("test.steps", {"steps": 1})
        WorkflowStep.objects.insert_step(run, "s0", "testproject.testing.workflows.plain_step")
        ids.append(run.pk)
    ago = datetime.timedelta(milliseconds=idle_ms)
    WorkflowRun.objects.filter(pk__in=ids).update(wake_at=None, updated_at=F("updated_at") - ago)
    WorkflowStep.objects.filter(run__in=ids).update(updated_at=F("updated_at") - ago)
    return ids


class ProcessTestCase(TransactionTestCase):
    """Starts command processes, logs each one's stderr to a file, and kills stragglers."""

    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="pikku-sweep-test-"))
        self.logs: dict[int, Path] = {}
        self.files: list[Any] = []

    def tearDown(self) -> None:
        kill_all(self.procs)
        for file in self.files:
            file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _file(self, name: str, mode: str = "w") -> Any:
        file = open(self.tmp / f"{len(self.files)}-{name}", mode)  # noqa: SIM115  (closed in tearDown)
        self.files.append(file)
        return file

    def command(
        self, *args: str, env: dict[str, str] | None = None, warm: bool = False, stdout: Any = subprocess.PIPE
    ) -> subprocess.Popen[str]:
        """
        Start ``manage.py args…`` on the live test database (with ``warm``, set
        up and waiting for "go"; see WARM). Its stderr goes to a file, so a
        chatty process never blocks on a full pipe.
        """
        log = self._file(f"{args[0]}.log")
        argv = [sys.executable, "-c", WARM, *args] if warm else [sys.executable, "manage.py", *args]
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env or subprocess_env(),
            stdin=subprocess.PIPE if warm else subprocess.DEVNULL,
            stdout=stdout,
            stderr=log,
            text=True,
        )
        self.procs.append(proc)
        self.logs[proc.pid] = Path(log.name)
        if warm:
            assert self.line(proc, timeout=60) == "warm\n"
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        return self.logs[proc.pid].read_text()

    def line(self, proc: subprocess.Popen[str], timeout: float) -> str:
        try:
            return read_line(proc, timeout=timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log(proc)}") from None

    def exits(self, proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
        """Wait for ``proc`` to exit (closing its stdin); its exit code and the rest of its stdout."""
        if proc.stdin is not None:
            proc.stdin.close()
        code = proc.wait(timeout=timeout)
        return code, proc.stdout.read() if proc.stdout is not None else ""

    def worker(self, holder: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """A ``pikku_worker`` that has said it is ready (its signal handlers are installed)."""
        proc = self.command("pikku_worker", "--holder", holder, *args, env=env)
        assert self.line(proc, timeout=60) == f"pikku_worker {holder} ready\n"
        return proc

    def stop(self, proc: subprocess.Popen[str], holder: str) -> int:
        """SIGTERM a worker: it must exit 0; returns the passes it made."""
        proc.send_signal(signal.SIGTERM)
        code, out = self.exits(proc, timeout=30)
        assert code == 0, self.log(proc)
        assert out.startswith(f"pikku_worker {holder} stopped after "), out
        return int(out.split("stopped after ")[1].split()[0])

    def sweep(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        """One ``pikku_sweep --json args…`` process: exits 0 and prints one report."""
        proc = self.command("pikku_sweep", "--json", *args, env=env)
        code, out = self.exits(proc)
        assert code == 0, self.log(proc)
        lines = out.splitlines()
        assert len(lines) == 1, out
        return json.loads(lines[0])

    def go(self, proc: subprocess.Popen[str]) -> None:
        send_line(proc, "go")

    def killed_mid_step(
        self, run: WorkflowRun, worker: subprocess.Popen[str] | None = None
    ) -> tuple[subprocess.Popen[str], int]:
        """
        Wait for the blocker's step to start, SIGKILL the worker running it,
        and return that worker and the kill time (DB clock).
        """
        first = poll_until(lambda: StepCall.objects.filter(run_id=run.pk, step="block").first(), timeout=60)
        (proc,) = [p for p in self.procs if p.pid == first.pid]
        assert worker is None or proc is worker
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        return proc, now_ms()


class KilledWorkerTests(ProcessTestCase):
    def test_sweep_wakes_a_killed_workers_run_once_its_step_lease_lapses(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        run = start_workflow("test.blocker", {"lease_ms": STEP_LEASE_MS})
        # Made ready beforehand, so they run while the step lease is surely live.
        early_sweep = self.command("pikku_sweep", "--json", warm=True, env=env)
        early_worker = self.command("pikku_worker", "--once", "--holder", "worker-early", warm=True, env=env)
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

        # Sweep until one wakes the run; none may before the lease lapses.
        sweeps: list[tuple[int, dict[str, Any]]] = []
        while not sweeps or not sweeps[-1][1]["woken_runs"]:
            assert time.monotonic() - killed < RECLAIM_WITHIN_S, f"no sweep woke the run: {sweeps}"
            report = self.sweep(env=env)
            sweeps.append((now_ms(), report))
        assert all(report["woken_runs"] == 0 for _, report in sweeps[:-1]), sweeps
        ended_ms, report = sweeps[-1]
        assert ended_ms >= lease_until
        assert (report["lapsed_runs"], report["woken_runs"], report["failed_steps"]) == (1, 1, 0), report
        woken = WorkflowRun.objects.get(pk=run.pk)
        assert (woken.wake_at, woken.sweep_wakes) == (WOKEN, 1)

        # A second worker takes the step again, as attempt 2, and completes the run.
        b = self.worker("worker-b", "--interval", "0.1", env=env)
        try:
            reclaimed = poll_until(
                lambda: running_at(step, 2), timeout=max(RECLAIM_WITHIN_S - (time.monotonic() - killed), 0)
            )
        except AssertionError:
            raise AssertionError(
                f"attempt 2 not claimed within {RECLAIM_WITHIN_S} s of the kill, though the sweep woke "
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
            f"\nsweep recovery ({run._state.db}, step lease {STEP_LEASE_MS} ms, "
            f"run lease {LONG_RUN_LEASE_MS} ms): "
            f"lease lapsed {lease_until - kill_ms} ms after the kill; woken by sweep {len(sweeps)} at "
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


class BacklogTests(ProcessTestCase):
    RUNS = 60
    STEPS = 5
    STEP_MS = 80
    WORKERS = 3
    SWEEP_INTERVAL = "1"

    def test_killed_step_is_taken_again_ahead_of_the_backlog(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        loop_out = self._file("sweep-loop.out")
        loop = self.command(
            "pikku_sweep",
            "--loop",
            "--interval",
            self.SWEEP_INTERVAL,
            "--stalled-after",
            "300",
            "--json",
            env=env,
            stdout=loop_out,
        )
        # Its first report is out: its signal handlers are installed.
        poll_until(lambda: Path(loop_out.name).read_text().count("\n") >= 1, timeout=60, interval=0.05)

        backlog = [
            start_workflow("test.slow_steps", {"steps": self.STEPS, "ms": self.STEP_MS}) for _ in range(5)
        ]
        blocked = start_workflow("test.blocker", {"lease_ms": STEP_LEASE_MS})
        backlog += [
            start_workflow("test.slow_steps", {"steps": self.STEPS, "ms": self.STEP_MS})
            for _ in range(self.RUNS - len(backlog))
        ]
        ids = [run.pk for run in backlog]
        holders = [f"worker-{i}" for i in range(self.WORKERS)]
        workers = [self.worker(holder, "--interval", "0.1", env=env) for holder in holders]

        victim, kill_ms = self.killed_mid_step(blocked)
        killed = time.monotonic()
        step = WorkflowStep.objects.get(run=blocked, step_name="block")
        assert (step.status, step.attempt) == ("running", 1)
        try:
            reclaimed = poll_until(lambda: running_at(step, 2), timeout=RECLAIM_WITHIN_S, interval=0.02)
        except AssertionError:
            raise AssertionError(
                f"attempt 2 not claimed within {RECLAIM_WITHIN_S} s of the kill "
                f"(step lease {STEP_LEASE_MS} ms, sweep every {self.SWEEP_INTERVAL} s): "
                f"{run_lease_state(blocked)}; "
                f"{WorkflowRun.objects.filter(pk__in=ids, status='running').count()} backlog runs left; "
                f"sweep reports: {Path(loop_out.name).read_text().splitlines()[-5:]}"
            ) from None
        seen_s = time.monotonic() - killed
        reclaim_ms = epoch_ms(reclaimed) - kill_ms
        # Unfinished when attempt 2 was claimed, on the DB clock.
        unfinished = (
            WorkflowRun.objects.filter(pk__in=ids)
            .exclude(status="completed", updated_at__lte=reclaimed)
            .count()
        )
        assert unfinished > 0, "the backlog was drained before the killed step was taken again: no proof"
        assert reclaim_ms <= RECLAIM_WITHIN_S * 1000

        poll_until(
            lambda: not WorkflowRun.objects.filter(pk__in=[*ids, blocked.pk], status="running").exists(),
            timeout=120,
            interval=0.1,
        )
        expected = [f"s{i} done" for i in range(self.STEPS)]
        assert list(WorkflowRun.objects.filter(pk__in=ids).values_list("status", "output")) == (
            [("completed", expected)] * self.RUNS
        )
        blocked.refresh_from_db()
        assert (blocked.status, blocked.output) == ("completed", {"block": {"call": 2}})
        assert attempts(step) == [(1, "running"), (2, "succeeded")]
        assert calls(blocked, "block")[0] == victim.pid

        # The sweep loop stops at once on SIGTERM, between passes, with exit 0.
        loop.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert loop.wait(timeout=10) == 0, self.log(loop)
        stop_s = time.monotonic() - signalled
        assert stop_s < 5, stop_s
        reports = [json.loads(line) for line in Path(loop_out.name).read_text().splitlines()]
        assert any(r["lapsed_runs"] and r["woken_runs"] for r in reports), reports
        for worker, holder in zip(workers, holders, strict=True):
            if worker is not victim:
                self.stop(worker, holder)

        print(  # noqa: T201 - measured, reported
            f"\nbacklog recovery ({blocked._state.db}, "
            f"{self.RUNS} runs x {self.STEPS} steps x {self.STEP_MS} ms, "
            f"{self.WORKERS} workers, step lease {STEP_LEASE_MS} ms, sweep every {self.SWEEP_INTERVAL} s): "
            f"kill -> attempt 2 claimed {reclaim_ms} ms (DB clock; seen after {seen_s * 1000:.0f} ms) with "
            f"{unfinished}/{self.RUNS} backlog runs unfinished; {len(reports)} sweep passes; "
            f"sweep loop exited {stop_s * 1000:.0f} ms after SIGTERM"
        )


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
        procs = [(option, value, self.command("pikku_sweep", option, value)) for option, value in bad]
        for option, value, proc in procs:
            code, out = self.exits(proc)
            err = self.log(proc)
            assert code == 2, (option, value, code, err)
            assert out == ""
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
            "pruned_leases",
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
