"""
Runs due later survive real ``manage.py pikku_sweep`` and ``manage.py
pikku_worker --once`` processes, however old their rows (issue 20): a task
deferred by ``run_after``, a step waiting out a retry delay, a run due in an
hour. The sweep still recovers a worker lost mid-step at once, whatever the
run's ``wake_at`` says: ``test_sweep_processes.KilledWorkerTests`` and
``test_recovery_processes`` hold that bound.

The rows are aged past both of the sweep's windows (``PIKKU_STALLED_AFTER_MS``
5 min, ``PIKKU_UNDISPATCHED_AFTER_MS`` 30 s) by moving their timestamps, never
by sleeping.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db.models import F

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.tasks.compat import TaskResultStatus, task_backends
from pikku_django.workflows import start_workflow
from testproject.testing import tasks
from tests.support.processes import ProcessTestCase, attempts, calls, now_ms, rows_of

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000
#: Older than both of the sweep's windows, by their defaults.
AGED = datetime.timedelta(minutes=10)


def age_rows(run: WorkflowRun) -> None:
    """Move the run's and its steps' last activity ten minutes into the past."""
    WorkflowRun.objects.filter(pk=run.pk).update(updated_at=F("updated_at") - AGED)
    WorkflowStep.objects.filter(run=run).update(updated_at=F("updated_at") - AGED)


class DueLaterProcessTests(ProcessTestCase):
    def sweep_then_worker(self, run: WorkflowRun) -> dict[str, Any]:
        """One ``pikku_sweep`` and one ``pikku_worker --once``: neither may touch ``run``."""
        before = rows_of(run)
        report = self.sweep()
        worker = self.command("pikku_worker", "--once", "--holder", "worker-once")
        assert self.exits(worker) == (
            0,
            "pikku_worker worker-once ready\npikku_worker worker-once stopped after 0 passes\n",
        ), self.log(worker)
        assert rows_of(run) == before
        return report

    def assert_nothing_woken(self, report: dict[str, Any]) -> None:
        counts = ("lapsed_runs", "stalled_runs", "undispatched_runs", "woken_runs", "backed_off_runs")
        assert {key: report[key] for key in counts} == dict.fromkeys(counts, 0), report

    def test_deferred_task_stays_ready_until_its_run_after(self) -> None:
        later = datetime.datetime.fromtimestamp((now_ms() + HOUR_MS) / 1000, tz=datetime.timezone.utc)
        result = tasks.note.using(run_after=later).enqueue("deferred")
        run = WorkflowRun.objects.get(pk=result.id)
        # Stored scheduled (in flight, as a sleep is), due at run_after.
        assert WorkflowStep.objects.get(run=run).status == "scheduled"
        age_rows(run)

        self.assert_nothing_woken(self.sweep_then_worker(run))
        assert task_backends["default"].get_result(result.id).status == TaskResultStatus.READY
        assert calls(run, "deferred") == []
        assert WorkflowRun.objects.values_list("wake_at", flat=True).get(pk=run.pk) > now_ms()

    def test_step_failed_with_a_retry_delay_is_not_run_again_early(self) -> None:
        run = start_workflow("test.retry_later", {"delay_ms": HOUR_MS})
        first = self.command("pikku_worker", "--once", "--holder", "worker-first")
        assert self.exits(first)[0] == 0, self.log(first)
        step = WorkflowStep.objects.get(run=run, step_name="flaky")
        assert (step.status, step.attempt, step.retry_delay) == ("failed", 1, HOUR_MS)
        assert calls(run, "flaky") == [first.pid]
        age_rows(run)

        self.assert_nothing_woken(self.sweep_then_worker(run))
        assert calls(run, "flaky") == [first.pid]
        assert attempts(step) == [(1, "failed")]
        assert WorkflowRun.objects.values_list("status", flat=True).get(pk=run.pk) == "running"

    def test_run_due_in_an_hour_last_touched_ten_minutes_ago_is_not_woken(self) -> None:
        run = WorkflowRun.objects.create_run("test.steps", {"steps": 1}, wake_at=now_ms() + HOUR_MS)
        age_rows(run)

        self.assert_nothing_woken(self.sweep_then_worker(run))
        assert calls(run, "s0") == []

    def test_a_stalled_run_beside_them_is_still_woken(self) -> None:
        # The same pass still finds what is stuck: a run with no wake time.
        waiting = WorkflowRun.objects.create_run("test.steps", {"steps": 1}, wake_at=now_ms() + HOUR_MS)
        stuck = WorkflowRun.objects.create_run("test.steps", {"steps": 1})
        WorkflowRun.objects.filter(pk=stuck.pk).update(wake_at=None)
        age_rows(waiting)
        age_rows(stuck)
        report = self.sweep()
        assert (report["stalled_runs"], report["woken_runs"]) == (1, 1), report
        worker = self.command("pikku_worker", "--once", "--holder", "worker-once")
        assert self.exits(worker)[0] == 0, self.log(worker)
        assert WorkflowRun.objects.values_list("status", flat=True).get(pk=stuck.pk) == "completed"
        assert WorkflowRun.objects.values_list("status", flat=True).get(pk=waiting.pk) == "running"
        assert calls(waiting, "s0") == []
