"""
Helpers for the tests that run real ``manage.py pikku_sweep`` and
``manage.py pikku_worker`` processes on the live test database: a process
test case that logs each process's stderr to a file and kills stragglers, and
small readers of the rows those processes write.
"""

from __future__ import annotations

import datetime
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from django.db.models import F
from django.test import TransactionTestCase

from pikku_django.models import Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from testproject.testing.models import PassRecord, StepCall
from tests.support.children import ROOT, kill_all, poll_until, read_line, send_line, subprocess_env

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
    """A stored instant in epoch ms; naive (USE_TZ = False) means UTC, as the app writes it."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
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


def everything() -> list[list[Any]]:
    """Every row of every table a sweep could touch, and the test app's (each a dict)."""
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


def rows_of(run: WorkflowRun) -> list[list[Any]]:
    """Every row the runtime keeps for ``run`` (each a dict), to prove that nothing changed."""
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
        """
        A ``pikku_worker`` that has said it is ready (its signal handlers are
        installed), with one lane and no sweep of its own unless ``args`` say
        otherwise: these tests follow one worker's passes and the sweeps they
        run themselves, and killing a worker of many lanes strands the steps
        of its other lanes until their leases lapse (the lanes and the
        worker's own sweep have their tests in tests/worker/test_lanes.py).
        """
        if "--concurrency" not in args:
            args = ("--concurrency", "1", *args)
        if "--sweep-interval" not in args:
            args = ("--no-sweep", *args)
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
        report: dict[str, Any] = json.loads(lines[0])
        return report

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
