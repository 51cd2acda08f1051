"""
After the first SIGTERM a worker's lane starts none of the runs it took
ahead: it hands them back (due at once, no budget spent) and exits once its
step in hand has ended; another worker runs each of them once.
"""

from __future__ import annotations

import signal
import time
from unittest import skipIf

import pytest
from django.db import connection

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.tasks.compat import TaskResultStatus
from testproject.testing import tasks
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase

pytestmark = pytest.mark.slow

NAP_MS = 1500
NAPS = 6
#: Enough no-op tasks before the naps that the lane's last pass before them is short.
QUICK = 60
#: Every pass counts as short, however busy the machine: the lanes take runs ahead whenever they may.
EVERY_PASS_SHORT = str(3_600_000)


class HandBackOnSigtermTests(ProcessTestCase):
    def test_a_stopping_worker_hands_back_the_runs_it_took_ahead(self) -> None:
        for i in range(QUICK):
            tasks.add.using(priority=5).enqueue(i, 1)
        naps = [tasks.noted_nap.using(priority=1).enqueue(f"nap-{i}", NAP_MS) for i in range(NAPS)]
        first = self.worker(
            "w-term",
            "--interval",
            "0.1",
            "-v",
            "2",
            env=subprocess_env(PIKKU_TAKE_AHEAD_BELOW_MS=EVERY_PASS_SHORT),
        )
        started = poll_until(lambda: StepCall.objects.filter(step__startswith="nap-").first(), timeout=60)
        first.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code, _ = self.exits(first, timeout=30)
        took_s = time.monotonic() - signalled
        assert code == 0, self.log(first)
        # The nap in hand ended; none other started.
        assert took_s < 2 * NAP_MS / 1000 + 3, took_s
        assert list(StepCall.objects.filter(step__startswith="nap-").values_list("step", flat=True)) == [
            started.step
        ]
        rest = [r.id for r in naps if r.id != str(started.run_id)]
        steps = WorkflowStep.objects.filter(run_id__in=rest)
        assert not steps.filter(status="running").exists()
        assert not steps.exclude(losses=0).exists()
        assert not WorkflowStepAttempt.objects.filter(step__in=steps, status="running").exists()
        handed_back = steps.filter(status="scheduled")
        assert handed_back.exists(), "no run was taken ahead: no proof"
        assert set(WorkflowRun.objects.filter(steps__in=handed_back).values_list("wake_at", flat=True)) == {0}
        assert "handed back" in self.log(first)

        second = self.worker("w-next", "--interval", "0.1")
        poll_until(lambda: not WorkflowRun.objects.filter(status="running").exists(), timeout=60)
        self.stop(second, "w-next")
        for result in naps:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id
            assert StepCall.objects.filter(run_id=result.id).count() == 1, result.id
            attempts = WorkflowStepAttempt.objects.filter(step__run_id=result.id)
            assert list(attempts.values_list("attempt", "status")) == [(1, "succeeded")], result.id


@skipIf(
    connection.vendor == "sqlite",
    "a process stopped inside SQLite's write transaction keeps the one write lock: no other "
    "process can take its runs over (tests/worker/test_hand_back.py covers the fence on SQLite)",
)
class PausedWorkerTests(ProcessTestCase):
    def test_a_worker_resumed_after_its_leases_lapsed_runs_nothing_it_took_ahead(self) -> None:
        env = subprocess_env(
            PIKKU_LEASE_TTL_MS="1500", PIKKU_STEP_LEASE_MS="1500", PIKKU_TAKE_AHEAD_BELOW_MS=EVERY_PASS_SHORT
        )
        go = self.tmp / "go"
        for i in range(QUICK):
            tasks.add.using(priority=5).enqueue(i, 1)
        nap = tasks.noted_nap.using(priority=3).enqueue("nap", NAP_MS)
        waits = [tasks.noted_wait.using(priority=2).enqueue(f"wait-{i}", str(go)) for i in range(3)]
        paused = self.worker("w-paused", "--interval", "0.1", "-v", "2", env=env)
        poll_until(lambda: StepCall.objects.filter(run_id=nap.id).exists(), timeout=60)
        ids = [w.id for w in waits]
        # The waits are taken (ahead of the nap, or by the idle lanes) once the lanes reach them.
        poll_until(lambda: WorkflowStep.objects.filter(run_id__in=ids, status="running").exists(), timeout=30)
        # A pause longer than its leases (a GC, a VM pause, swap)...
        paused.send_signal(signal.SIGSTOP)
        try:
            # ...while another worker takes the runs over and is running them.
            other = self.worker(
                "w-other", "--interval", "0.1", "--sweep-interval", "0.5", "--concurrency", "4", env=env
            )
            poll_until(lambda: StepCall.objects.filter(run_id__in=ids).count() == len(ids), timeout=60)
        finally:
            paused.send_signal(signal.SIGCONT)
        # Resumed, its lane cannot vouch for the runs it took ahead and hands
        # them back (guarded: the other worker's are left alone), never runs them.
        mine = StepCall.objects.filter(run_id__in=ids, pid=paused.pid)
        poll_until(lambda: "runs taken ahead" in self.log(paused) or mine.exists(), timeout=30)
        assert not mine.exists()
        go.touch()
        poll_until(lambda: not WorkflowRun.objects.filter(status="running").exists(), timeout=60)
        self.stop(paused, "w-paused")
        self.stop(other, "w-other")
        for result in waits:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id
            calls = StepCall.objects.filter(run_id=result.id)
            assert list(calls.values_list("pid", flat=True)) == [other.pid], result.id
