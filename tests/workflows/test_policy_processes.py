"""
A backoff is judged on the database clock: a worker whose own clock runs an
hour fast (``faketime +1h``) retries nothing early (PostgreSQL, MariaDB; on
SQLite the database clock is the process clock by design).
"""

from __future__ import annotations

import json
from unittest import skipIf

from django.db import connection

from pikku_django.models import WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.children import run_script
from tests.support.workers import WorkerProcessTestCase
from tests.workflows import test_policies

#: Under ``faketime +1h``: one ``Worker(once=True)`` batch and one direct
#: ``run_workflow`` of the run in its backoff; reports its own clock beside the DB's.
SKEWED_WORKER = """
import json, sys, time
import django
django.setup()
import tests.workflows.test_policies
from pikku_django.models import Lease
from pikku_django.worker import Worker
from pikku_django.workflows import run_workflow

run_id = sys.argv[1]
report = {"time_ms": int(time.time() * 1000), "db_now_ms": Lease.objects.db_now_ms()}
report["passes"] = Worker(once=True, holder="fast").run()
run = run_workflow(run_id)
report["status"], report["wake_at"] = run.status, run.wake_at
print(json.dumps(report), flush=True)
"""


@skipIf(connection.vendor == "sqlite", "on SQLite the DB clock is the process clock by design (one host)")
class BackoffClockTests(WorkerProcessTestCase):
    def test_a_worker_an_hour_fast_retries_nothing_early(self) -> None:
        test_policies.calls.clear()
        # A 10-minute backoff after the first failure: an hour fast, a worker's own clock is past it.
        run = start_workflow(
            "policies.step", {"key": "skew", "failures": 1, "max_attempts": 2, "backoff": "ten"}
        )
        run = run_workflow(run.pk)
        assert run.status == "running" and test_policies.calls["skew"] == 1
        wake_at = run.wake_at
        proc = run_script(SKEWED_WORKER, str(run.pk), prefix=["faketime", "-f", "+1h"])
        self.procs.append(proc)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        report = json.loads(out)
        skew = report["time_ms"] - report["db_now_ms"]
        assert abs(skew - 3_600_000) < 60_000, skew
        assert report["passes"] == 0
        assert (report["status"], report["wake_at"]) == ("running", wake_at)
        step = WorkflowStep.objects.get(run=run)
        assert (step.status, step.attempt) == ("failed", 1)
        assert WorkflowStepAttempt.objects.filter(step=step).count() == 1
