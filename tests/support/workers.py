"""
A test case that starts real ``manage.py pikku_worker`` processes on the live
test database (one lane, no sweep of its own), logs each one's stderr to a
file and kills stragglers; and readers of the rows those workers write.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from testproject.testing.models import StepCall
from tests.support.children import ROOT, kill_all, read_line, subprocess_env


def epoch_ms(value: Any) -> int:
    """A datetime as epoch milliseconds."""
    return int(value.timestamp() * 1000)


def calls(run: WorkflowRun) -> list[tuple[str, int]]:
    """The run's step-body calls, (step, pid), in the order they happened."""
    return list(StepCall.objects.filter(run_id=run.pk).order_by("at_ms", "pk").values_list("step", "pid"))


def attempts(step: WorkflowStep) -> list[tuple[int, str]]:
    return list(
        WorkflowStepAttempt.objects.filter(step=step).order_by("attempt").values_list("attempt", "status")
    )


def snapshot(run: WorkflowRun) -> dict[str, Any]:
    """Every row the runtime keeps for ``run``, to prove that nothing changed."""
    return {
        "run": list(WorkflowRun.objects.filter(pk=run.pk).values()),
        "steps": list(WorkflowStep.objects.filter(run=run).order_by("step_name").values()),
        "attempts": list(
            WorkflowStepAttempt.objects.filter(step__run=run).order_by("step__step_name", "attempt").values()
        ),
        "calls": list(StepCall.objects.filter(run_id=run.pk).order_by("pk").values()),
    }


def status(run: WorkflowRun) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(pk=run.pk)


class WorkerProcessTestCase(TransactionTestCase):
    """Starts worker processes, logs each one's stderr to a file, and kills stragglers."""

    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="pikku-worker-test-"))
        self.logs: dict[int, Path] = {}
        self.log_files: list[Any] = []

    def tearDown(self) -> None:
        kill_all(self.procs)
        for file in self.log_files:
            file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def worker(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """
        Start ``manage.py pikku_worker args…`` on the live test database,
        with one lane and no sweep of its own (these tests follow one worker's
        passes and the sweeps they run; the lanes are tests/worker/test_lanes.py's).
        Its stderr (the log) goes to a file, so a chatty worker never blocks
        on a full pipe; stdout is a pipe for the "ready" line.
        """
        log = self.tmp / f"worker-{len(self.log_files)}.log"
        file = open(log, "w")  # noqa: SIM115  (closed in tearDown)
        self.log_files.append(file)
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "pikku_worker", "--concurrency", "1", "--no-sweep", *args],
            cwd=ROOT,
            env=env or subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=file,
            text=True,
        )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        return self.logs[proc.pid].read_text()

    def ready(self, proc: subprocess.Popen[str], holder: str) -> None:
        """Wait for the worker's "ready" line (its signal handlers are installed by then)."""
        try:
            line = read_line(proc, timeout=60)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log(proc)}") from None
        assert line == f"pikku_worker {holder} ready\n"

    def exits(self, proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
        """Wait for ``proc`` to exit; its exit code and the rest of its stdout."""
        code = proc.wait(timeout=timeout)
        assert proc.stdout is not None
        return code, proc.stdout.read()

    def stop(self, proc: subprocess.Popen[str], holder: str) -> str:
        """SIGTERM an idle worker: it must exit 0 and say how many passes it made."""
        proc.send_signal(signal.SIGTERM)
        code, out = self.exits(proc, timeout=30)
        assert code == 0, self.log(proc)
        assert out.startswith(f"pikku_worker {holder} stopped after "), out
        return out

    def once(self, holder: str, env: dict[str, str] | None = None) -> str:
        """One ``pikku_worker --once``: drains what is due and exits 0."""
        proc = self.worker("--once", "--holder", holder, env=env)
        code, out = self.exits(proc, timeout=60)
        assert code == 0, self.log(proc)
        return out
