"""Retries of one run raced by real OS processes: the run is revived once."""

from __future__ import annotations

import json
import subprocess

from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import cancel_workflow, start_workflow
from tests.support.children import kill_all, read_line, send_line, start_script

ROUNDS = 10

#: Answers each run id on stdin with retry_workflow's answer, until EOF.
RETRIER = """
import json, sys
import django
django.setup()
from pikku_django.models import WorkflowRun
from pikku_django.workflows import retry_workflow

WorkflowRun.objects.exists()  # connect before the first command
print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps(retry_workflow(line.strip())), flush=True)
"""


class RetryRaceTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = [start_script(RETRIER) for _ in range(2)]
        for proc in self.procs:
            assert read_line(proc, timeout=60).strip() == "ready"

    def tearDown(self) -> None:
        kill_all(self.procs)

    def test_racing_retries_revive_a_run_once(self) -> None:
        for i in range(ROUNDS):
            run = start_workflow("test.steps", {"steps": 1})
            step = WorkflowStep.objects.start_step(
                run.pk, "s0", "testproject.testing.workflows.plain_step", 60_000
            )
            assert step is not None
            assert cancel_workflow(run.pk) is True
            for proc in self.procs:
                send_line(proc, str(run.pk))
            answers = [json.loads(read_line(proc, timeout=60)) for proc in self.procs]
            assert sorted(answers) == [False, True], (i, answers)
            assert WorkflowRun.objects.get(pk=run.pk).status == "running"
            # One revival: the fenced step's attempt 1 still failed, no second bump.
            step.refresh_from_db()
            assert (step.status, step.attempt, step.budget_base) == ("failed", 1, 1)
            assert list(WorkflowStepAttempt.objects.filter(step=step).values_list("attempt", flat=True)) == [
                1
            ]
