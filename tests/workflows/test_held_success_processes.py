"""
A step's success that a pass holds for its next write is committed within a
short window even while the workflow's own code runs on: a worker killed
after that window, between two steps, never runs the step again.
"""

from __future__ import annotations

import signal
import time

import pytest

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows import start_workflow
from pikku_django.workflows.in_progress import PENDING_WINDOW_S
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase, status

pytestmark = pytest.mark.slow

THINK_S = 3.0


class HeldSuccessTests(ProcessTestCase):
    def test_a_success_held_while_the_workflow_thinks_is_written_within_the_window(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS="1500", PIKKU_STEP_LEASE_MS="1500")
        run = start_workflow("test.thinks_between_steps", {"think_s": THINK_S})
        first = self.worker("w-thinks", "--interval", "0.1", env=env)
        called = poll_until(lambda: StepCall.objects.filter(run_id=run.pk, step="a").first(), timeout=60)
        seen = time.monotonic()
        step = poll_until(
            lambda: WorkflowStep.objects.filter(run=run, step_name="a", status="succeeded").first(), timeout=5
        )
        # Written while the workflow's code still runs, well within a second.
        written_s = time.monotonic() - seen
        assert written_s < 1.0, written_s
        assert not WorkflowStep.objects.filter(run=run, step_name="b").exists()
        assert StepCall.objects.get(run_id=run.pk, step="a").pid == called.pid == first.pid
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL

        second = self.worker("w-next", "--interval", "0.1", "--sweep-interval", "0.5", env=env)
        poll_until(lambda: status(run) == "completed", timeout=60)
        self.stop(second, "w-next")
        # Step "a" ran once: its success outlived its worker.
        assert StepCall.objects.filter(run_id=run.pk, step="a").count() == 1
        assert WorkflowStep.objects.get(pk=step.pk).attempt == 1
        assert WorkflowRun.objects.get(pk=run.pk).output == {"a": 0, "b": 0}
        assert PENDING_WINDOW_S < 1.0
