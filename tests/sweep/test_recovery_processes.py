"""
A run whose step lost its worker is driven ahead of every run that is only
waiting its turn, however large and however old the backlog: real
``pikku_worker`` processes, one SIGKILLed mid-step, and a ``pikku_sweep
--loop``; kill -> attempt 2 claimed is measured on the database clock.
"""

from __future__ import annotations

import datetime
import json
import signal
import time
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import F

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows import start_workflow
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import (
    LONG_RUN_LEASE_MS,
    RECLAIM_WITHIN_S,
    STEP_LEASE_MS,
    ProcessTestCase,
    attempts,
    calls,
    epoch_ms,
    run_lease_state,
    running_at,
)

pytestmark = pytest.mark.slow


class BacklogTests(ProcessTestCase):
    RUNS = 60
    STEPS = 5
    STEP_MS = 80
    WORKERS = 3
    SWEEP_INTERVAL = "1"

    def test_killed_step_is_taken_again_ahead_of_the_backlog(self) -> None:
        self.recover_behind_backlog(stalled_after="300")

    def test_killed_step_goes_first_even_when_the_backlog_is_older_than_stalled_after(self) -> None:
        # Every queued run is "stalled" to the sweep (due, nothing in flight,
        # idle past --stalled-after): waking them too must not put the run
        # that lost its worker back behind them.
        self.recover_behind_backlog(stalled_after="1", backlog_age_ms=10_000)

    def recover_behind_backlog(self, stalled_after: str, backlog_age_ms: int = 0) -> None:
        """
        A worker is SIGKILLed in a step while the other workers work through
        a backlog of due runs; attempt 2 of that step must be claimed within
        the step lease + the sweep interval + a few seconds, long before the
        backlog is drained.
        """
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        loop_out = self._file("sweep-loop.out")
        loop = self.command(
            "pikku_sweep",
            "--loop",
            "--interval",
            self.SWEEP_INTERVAL,
            "--stalled-after",
            stalled_after,
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
        if backlog_age_ms:
            # All queued a while ago (in the same order): due, and idle for
            # longer than --stalled-after.
            ago = datetime.timedelta(milliseconds=backlog_age_ms)
            WorkflowRun.objects.filter(pk__in=[*ids, blocked.pk]).update(
                wake_at=F("wake_at") - backlog_age_ms,
                created_at=F("created_at") - ago,
                updated_at=F("updated_at") - ago,
            )
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
        # The sweep lapsed the dead worker's run lease and woke its run: in
        # one pass, or in two when the step lease lapsed between the pass's
        # lapse check and its stall check.
        assert any(r["lapsed_runs"] for r in reports) and any(r["woken_runs"] for r in reports), reports
        for worker, holder in zip(workers, holders, strict=True):
            if worker is not victim:
                self.stop(worker, holder)

        print(  # noqa: T201 - measured, reported
            f"\nbacklog recovery ({connection.vendor}, --stalled-after {stalled_after}, "
            f"{self.RUNS} runs x {self.STEPS} steps x {self.STEP_MS} ms, "
            f"{self.WORKERS} workers, step lease {STEP_LEASE_MS} ms, sweep every {self.SWEEP_INTERVAL} s): "
            f"kill -> attempt 2 claimed {reclaim_ms} ms (DB clock; seen after {seen_s * 1000:.0f} ms) with "
            f"{unfinished}/{self.RUNS} backlog runs unfinished; {len(reports)} sweep passes; "
            f"sweep loop exited {stop_s * 1000:.0f} ms after SIGTERM"
        )
