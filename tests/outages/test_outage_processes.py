"""
A database restart in the middle of the work: a real ``pikku_worker`` and a
``pikku_sweep --loop`` outlive it (logging it once each, waiting it out with a
back-off), every run completes, and no step body runs more than a kill would
excuse. The server is stopped and started with the commands .ci/run uses, and
always started again in a ``finally``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from unittest import skipIf

import pytest
from django.db import connection
from django.db.models import Count

from pikku_django.models import WorkflowRun, WorkflowStepAttempt
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase
from tests.support.servers import server_down

# They stop the server: never beside other tests on it (see tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.restarts_server]

UNAVAILABLE = "the database is unavailable"
BACK = "the database is back after"


@skipIf(connection.vendor == "sqlite", "SQLite is a file in the worker's own process: there is no server")
class DatabaseRestartTests(ProcessTestCase):
    RUNS = 8
    STEPS = 4
    STEP_MS = 150
    #: How long the server stays down.
    DOWN_S = 3.0

    def wait_for_log(self, proc: subprocess.Popen[str], text: str, timeout: float = 30) -> None:
        try:
            poll_until(lambda: text in self.log(proc), timeout=timeout, interval=0.05)
        except AssertionError:
            raise AssertionError(f"{text!r} not in the log:\n{self.log(proc)}") from None

    def test_worker_and_sweep_loop_outlive_a_restart(self) -> None:
        # Short leases, so a step in hand when the connection dropped is taken
        # again soon after the database is back.
        env = subprocess_env(PIKKU_LEASE_TTL_MS="2000", PIKKU_STEP_LEASE_MS="2000")
        runs = [
            start_workflow("test.slow_steps", {"steps": self.STEPS, "ms": self.STEP_MS})
            for _ in range(self.RUNS)
        ]
        ids = [run.pk for run in runs]
        sweep_out = self._file("sweep.out")
        sweep = self.command(
            "pikku_sweep", "--loop", "--interval", "0.5", "--stalled-after", "2", "--json",
            env=env, stdout=sweep_out,
        )  # fmt: skip
        worker = self.worker("worker-restart", "--interval", "0.1", env=env)
        poll_until(lambda: StepCall.objects.exists(), timeout=60, interval=0.02)

        with server_down():
            down = time.monotonic()
            # Both meet the outage and say so; neither exits.
            self.wait_for_log(worker, UNAVAILABLE)
            self.wait_for_log(sweep, UNAVAILABLE)
            # A few seconds down, as a restart or failover takes: long enough
            # for several back-off retries to fail.
            time.sleep(max(0.0, self.DOWN_S - (time.monotonic() - down)))
            assert worker.poll() is None, self.log(worker)
            assert sweep.poll() is None, self.log(sweep)
            outage_s = time.monotonic() - down
        back = time.monotonic()

        # Work resumes once the database answers again, and every run completes.
        poll_until(
            lambda: not WorkflowRun.objects.filter(pk__in=ids, status="running").exists(),
            timeout=120,
            interval=0.1,
        )
        done_s = time.monotonic() - back
        self.wait_for_log(worker, BACK)
        self.wait_for_log(sweep, BACK)
        assert worker.poll() is None and sweep.poll() is None
        expected = [f"s{i} done" for i in range(self.STEPS)]
        assert list(WorkflowRun.objects.filter(pk__in=ids).values_list("status", "output")) == (
            [("completed", expected)] * self.RUNS
        )

        # Nothing ran twice but what a kill would excuse: the one step in hand
        # when the connection dropped may have run again as a new attempt.
        per_step = StepCall.objects.filter(run_id__in=ids).values("run_id", "step").annotate(n=Count("pk"))
        counts = sorted(row["n"] for row in per_step)
        assert len(counts) == self.RUNS * self.STEPS and counts[-1] <= 2 and counts.count(2) <= 1, counts
        retried = WorkflowStepAttempt.objects.filter(step__run__in=ids, attempt__gt=1).count()
        assert retried <= 1, retried

        # Logged once each, not once per try.
        for proc in (worker, sweep):
            assert self.log(proc).count(UNAVAILABLE) == 1, self.log(proc)
        passes = self.stop(worker, "worker-restart")
        assert passes >= self.RUNS
        sweep.terminate()
        assert self.exits(sweep)[0] == 0, self.log(sweep)
        reports = [json.loads(line) for line in Path(sweep_out.name).read_text().splitlines()]
        print(  # noqa: T201 - measured, reported
            f"\ndatabase restart ({connection.vendor}): down {outage_s:.1f} s; all {self.RUNS} runs done "
            f"{done_s:.1f} s after it was back; {retried} step attempts retried; "
            f"{passes} worker passes; {len(reports)} sweep passes"
        )

    def test_a_database_stopped_under_a_step_never_reaches_the_workflows_except(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS="2000", PIKKU_STEP_LEASE_MS="2000")
        release, back = self.tmp / "release", self.tmp / "back"
        run = start_workflow("test.catches_around", {"release": str(release), "back": str(back)})
        worker = self.worker("worker-catches", "--interval", "0.1", env=env)
        poll_until(lambda: StepCall.objects.filter(run_id=run.pk).exists(), timeout=60, interval=0.02)
        with server_down():
            # The step returns while the database is down: recording it fails.
            release.touch()
            self.wait_for_log(worker, UNAVAILABLE)
        # Were the failure the workflow's to catch, it would now take its
        # "not charged" branch with the database back.
        back.touch()
        poll_until(lambda: WorkflowRun.objects.get(pk=run.pk).status != "running", timeout=60, interval=0.1)
        self.stop(worker, "worker-catches")
        done = WorkflowRun.objects.get(pk=run.pk)
        assert (done.status, done.output) == ("completed", "charged"), self.log(worker)
