"""
What ``pikku_worker`` tells at its default verbosity, from a real worker
process: each run's end (a failed one with its error's last line), each
failed attempt and its retry, and each step taken over from a lost worker;
every line names its run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows import start_workflow
from testproject.testing import tasks
from tests.support.children import ROOT, subprocess_env
from tests.support.factories import lapse_step

pytestmark = pytest.mark.slow

PLAIN_STEP = "testproject.testing.workflows.plain_step"


def worker_once(*args: str) -> tuple[str, str]:
    """``manage.py pikku_worker --once`` at its default verbosity: stdout and stderr."""
    done = subprocess.run(
        [sys.executable, "manage.py", "pikku_worker", "--once", "--no-schedules", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def lines_of(run: WorkflowRun, err: str) -> list[str]:
    """The app's log lines that name ``run``, from after the logger's name."""
    return [
        line.split(": ", 1)[1]
        for line in err.splitlines()
        if str(run.pk) in line and " pikku_django." in line
    ]


class WorkerLogTests(TransactionTestCase):
    def test_run_ends_failed_attempts_and_retries_are_logged(self) -> None:
        done = start_workflow("test.steps", {"steps": 2})
        missing = str(Path(tempfile.mkdtemp()) / "never")
        failed = start_workflow("test.fragile", {"path": missing})
        _, err = worker_once()
        assert "Traceback" not in err, err
        assert lines_of(done, err) == [f"Run {done.pk} (test.steps) completed."], err
        assert lines_of(failed, err) == [
            f"Run {failed.pk}: step 'fragile' attempt 1 failed (RuntimeError: {missing} is missing); "
            "it will be retried.",
            f"Run {failed.pk}: step 'fragile' attempt 2 failed (RuntimeError: {missing} is missing); "
            "no attempt is left.",
            f"Run {failed.pk} (test.fragile) failed in step 'fragile': RuntimeError: {missing} is missing",
        ], err
        assert WorkflowRun.objects.get(pk=failed.pk).status == "failed"

    def test_a_task_run_is_named_after_its_task(self) -> None:
        result = tasks.add.enqueue(2, 3)
        failed = tasks.explode.enqueue("no luck")
        _, err = worker_once()
        run = WorkflowRun.objects.get(pk=result.id)
        assert lines_of(run, err) == [f"Run {run.pk} (task testproject.testing.tasks.add) completed."], err
        # Its attempt's failure commits with the run's, and is told first.
        run = WorkflowRun.objects.get(pk=failed.id)
        assert lines_of(run, err) == [
            f"Run {run.pk}: step 'task' attempt 1 failed (ValueError: no luck); no attempt is left.",
            f"Run {run.pk} (task testproject.testing.tasks.explode) failed in step 'task': "
            "ValueError: no luck",
        ], err

    def test_a_step_taken_over_from_a_lost_worker_is_logged(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        steps = WorkflowStep.objects
        step = steps.insert_step(run, "s0", PLAIN_STEP, retries=2)
        # A worker named "gone-worker" claimed it, then died: its lease lapses.
        assert steps.claim(run.pk, "s0", PLAIN_STEP, 60_000, holder="gone-worker") is not None
        lapse_step(step)
        _, err = worker_once()
        assert lines_of(run, err) == [
            f"Run {run.pk}: step 's0' taken over from lost worker gone-worker (attempt 2).",
            f"Run {run.pk} (test.steps) completed.",
        ], err

    def test_verbosity_0_tells_none_of_it(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        _, err = worker_once("-v", "0")
        assert str(run.pk) not in err, err
        assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
