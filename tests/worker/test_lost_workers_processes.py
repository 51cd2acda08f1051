"""
A lost worker is charged only to an attempt whose function it started: a
worker SIGKILLed with runs it took ahead leaves them due again with their
budgets untouched (even with ``worker_losses`` 0), and one task that kills
every worker that runs it spends only its own budget, under two supervised
workers, while the tasks taken with it each succeed.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.tasks.compat import TaskResultStatus
from testproject.testing import tasks
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase

pytestmark = pytest.mark.slow


def short_leases() -> dict[str, str]:
    """
    A child's environment with short leases (a killed worker's runs are due
    again within seconds), whose lanes take runs ahead after any pass: on a
    busy machine no pass is under the default 5 ms (PIKKU_TAKE_AHEAD_BELOW_MS).
    """
    return subprocess_env(
        PIKKU_LEASE_TTL_MS="1500", PIKKU_STEP_LEASE_MS="1500", PIKKU_TAKE_AHEAD_BELOW_MS=str(3_600_000)
    )


#: No-op tasks first, so that the lane has passes behind it and takes runs ahead.
QUICK = 60


def quick_backlog() -> None:
    for i in range(QUICK):
        tasks.add.using(priority=5).enqueue(i, 1)


class LostWorkerTests(ProcessTestCase):
    def test_runs_taken_ahead_by_a_killed_worker_keep_their_budgets(self) -> None:
        quick_backlog()
        blocker = tasks.block_first_without_losses.using(priority=3).enqueue()
        notes = [tasks.note_without_losses.using(priority=2).enqueue(f"note-{i}") for i in range(7)]
        first = self.worker("w-killed", "--interval", "0.1", env=short_leases())
        poll_until(lambda: StepCall.objects.filter(run_id=blocker.id).exists(), timeout=60)
        taken_ahead = WorkflowStep.objects.filter(run_id__in=[n.id for n in notes], status="running")
        assert taken_ahead.filter(provisional=True).exists(), "no run was taken ahead: no proof"
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        assert not StepCall.objects.filter(step__startswith="note-").exists()

        second = self.worker("w-next", "--interval", "0.1", "--sweep-interval", "0.5", env=short_leases())
        poll_until(lambda: not WorkflowRun.objects.filter(status="running").exists(), timeout=60)
        self.stop(second, "w-next")
        for result in [blocker, *notes]:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, (result.id, result.errors)
        # Every note ran once; no loss was counted against any budget.
        assert StepCall.objects.filter(step__startswith="note-").count() == len(notes)
        assert set(WorkflowStep.objects.values_list("losses", flat=True)) == {0}

    def test_a_poison_task_spends_only_its_own_budget(self) -> None:
        quick_backlog()
        poison = tasks.kill_every_worker.using(priority=3).enqueue()
        notes = [tasks.note.using(priority=2).enqueue(f"note-{i}") for i in range(7)]
        slots = ["w-a", "w-b"]
        running: dict[str, subprocess.Popen[str]] = {}
        kills = 0
        deadline = time.monotonic() + 120
        while WorkflowRun.objects.filter(status="running").exists():
            assert time.monotonic() < deadline, f"not done after {kills} kills"
            for slot in slots:
                proc = running.get(slot)
                if proc is not None and proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL, self.log(proc)
                    kills += 1
                    proc = None
                if proc is None:
                    running[slot] = self.worker(
                        f"{slot}-{kills}", "--interval", "0.1", "--sweep-interval", "0.5", env=short_leases()
                    )
            time.sleep(0.1)
        for proc in running.values():
            if proc.poll() is None:
                self.stop(proc, proc.args[proc.args.index("--holder") + 1])
        poison.refresh()
        assert poison.status == TaskResultStatus.FAILED
        # Its budget (worker_losses 2) was spent by its own losses, one counted every other kill.
        step = WorkflowStep.objects.get(run_id=poison.id)
        assert step.losses == 3, (step.losses, kills)
        for result in notes:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, (result.id, result.errors)
            calls = StepCall.objects.filter(run_id=result.id).count()
            assert 1 <= calls <= kills, (result.id, calls, kills)
        assert set(WorkflowStep.objects.exclude(run_id=poison.id).values_list("losses", flat=True)) == {0}
