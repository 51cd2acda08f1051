"""
A worker SIGSTOPped past its leases and resumed changes nothing once another
worker has finished the run: its late result is refused, and its pass writes
no run row.
"""

from __future__ import annotations

import signal

import pytest

from pikku_django.models import Lease, WorkflowStep
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase, attempts, rows_of, status

pytestmark = pytest.mark.slow


class StaleWorkerTests(ProcessTestCase):
    def test_a_worker_paused_past_its_leases_changes_nothing_when_it_resumes(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS="1500", PIKKU_STEP_LEASE_MS="1500")
        release = self.tmp / "release"
        run = start_workflow("test.hold_then_more", {"path": str(release)})
        paused = self.worker("paused", "--interval", "0.05", env=env)
        poll_until(lambda: StepCall.objects.filter(run_id=run.pk, step="hold").exists(), timeout=30)
        paused.send_signal(signal.SIGSTOP)
        try:
            # Both of its leases lapse on the database clock while it sleeps.
            step = WorkflowStep.objects.get(run=run, step_name="hold")
            poll_until(
                lambda: (
                    WorkflowStep.objects.lapsed().filter(pk=step.pk).exists()
                    and Lease.objects.current(run.lease_key) is None
                ),
                timeout=30,
            )
            release.touch()
            other = self.command("pikku_worker", "--once", "--holder", "other", "--no-sweep", env=env)
            assert self.exits(other, timeout=60)[0] == 0, self.log(other)
            assert status(run) == "completed"
            before = rows_of(run)
        finally:
            paused.send_signal(signal.SIGCONT)
        # The paused worker wakes inside its step, which now returns: its
        # result is refused and its pass stops, writing nothing.
        poll_until(lambda: "was superseded" in self.log(paused), timeout=30)
        self.stop(paused, "paused")
        assert rows_of(run) == before
        assert attempts(step) == [(1, "running"), (2, "succeeded")]
