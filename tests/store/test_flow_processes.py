"""
A rate limit holds on the database clock whatever the workers' own clocks:
two worker processes, one of them an hour fast (``faketime +1h``), drain a
rated queue; the DB-clock start times satisfy
``t[i + limit + burst] − t[i] ≥ period_ms`` and every run finishes
(PostgreSQL, MariaDB; on SQLite the database clock is the process clock by design).
"""

from __future__ import annotations

import json
from unittest import skipIf

from django.db import connection

from pikku_django.models import WorkflowRun, WorkflowStepAttempt
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, run_script, subprocess_env
from tests.support.workers import WorkerProcessTestCase

LIMIT, BURST, PERIOD_MS = 2, 1, 600

#: libfaketime preloaded into the worker itself (the ``faketime`` command
#: forks, so a signal sent to it would not reach the worker): its wall clock
#: an hour fast, its monotonic clock left alone.
FAST_CLOCK = {
    "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "FAKETIME": "+1h",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
}

#: The process's own clock minus the database's, in ms.
CLOCKS = """
import json, time
import django
django.setup()
from pikku_django.models import Lease
print(json.dumps(int(time.time() * 1000) - Lease.objects.db_now_ms()), flush=True)
"""
RATED = {"rated": {"rate": {"limit": LIMIT, "period_ms": PERIOD_MS, "burst": BURST}}}


@skipIf(connection.vendor == "sqlite", "on SQLite the DB clock is the process clock by design (one host)")
class RateClockTests(WorkerProcessTestCase):
    def test_two_workers_an_hour_apart_keep_the_rate_on_the_db_clock(self) -> None:
        env = subprocess_env(PIKKU_QUEUES=json.dumps(RATED))
        fast = {**env, **FAST_CLOCK}
        skew = json.loads(run_script(CLOCKS, env=fast).communicate(timeout=60)[0])
        assert abs(skew - 3_600_000) < 60_000, skew
        # The fast clock takes part: its worker is ready first and takes the first runs.
        workers = [self.worker("--holder", "fast", "--interval", "0.05", env=fast)]
        self.ready(workers[0], "fast")
        runs = [start_workflow("test.steps", {"steps": 1}, queue="rated") for _ in range(10)]
        attempts = WorkflowStepAttempt.objects.filter(holder="fast")
        poll_until(attempts.exists, timeout=30, interval=0.05)
        workers.append(self.worker("--holder", "true", "--interval", "0.05", env=env))
        self.ready(workers[1], "true")
        done = WorkflowRun.objects.filter(status="completed")
        poll_until(lambda: done.count() == len(runs), timeout=60, interval=0.05)
        starts = sorted(WorkflowRun.objects.values_list("rate_at", flat=True))
        gaps = [starts[i + LIMIT + BURST] - starts[i] for i in range(len(starts) - LIMIT - BURST)]
        assert min(gaps) >= PERIOD_MS, starts
        # Each run's step ran after its admission, on the database clock.
        for run in WorkflowRun.objects.all():
            (called,) = StepCall.objects.filter(run_id=run.pk).values_list("at_ms", flat=True)
            assert run.rate_at is not None and called >= run.rate_at
        # Only these two workers drove runs, the fast one among them.
        holders = set(WorkflowStepAttempt.objects.values_list("holder", flat=True))
        assert "fast" in holders and holders <= {"fast", "true"}, holders
        for proc in workers:
            proc.terminate()
        for proc in workers:
            assert proc.wait(timeout=60) == 0, self.log(proc)
