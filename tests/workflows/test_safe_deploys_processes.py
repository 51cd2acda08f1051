"""
A deploy under runs in flight, with real worker processes: runs started
and driven under v1 (``PIKKU_TEST_DEPLOY=v1``) wait at a sleep or for a
signal; a v2 worker then drives them: they keep the old branch, a new run
takes the new one, a moved ``@step_function`` changes nothing, and a moved
function without an id parks its run until it is retried under code that
fits.
"""

from __future__ import annotations

from django.test import override_settings

from pikku_django.models import Lease, WorkflowPatch, WorkflowRun, WorkflowStep
from pikku_django.workflows import retry_workflow, send_signal, start_workflow
from testproject.testing.deploy_workflows import DEPLOY
from testproject.testing.models import StepCall
from tests.support.children import subprocess_env
from tests.support.workers import WorkerProcessTestCase


def env(version: str, **extra: str) -> dict[str, str]:
    return subprocess_env(**{DEPLOY: version, "PIKKU_CODE_VERSION": version, **extra})


def wake_sleep(run: WorkflowRun) -> None:
    step = WorkflowStep.objects.get(run=run, step_name="cool-off")
    now = Lease.objects.db_now_ms()
    WorkflowStep.objects.filter(pk=step.pk).update(data={**step.data, "wake_at": now - 1})
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=now - 1)


def called(run: WorkflowRun) -> list[str]:
    return list(StepCall.objects.filter(run_id=run.pk).order_by("id").values_list("step", flat=True))


class DeployProcessTests(WorkerProcessTestCase):
    def drain(self, holder: str, environment: dict[str, str], *runs: WorkflowRun) -> None:
        """``--once`` workers until none of ``runs`` is running and due (a 1 ms sleep may fall due)."""
        for attempt in range(5):
            self.once(f"{holder}-{attempt}", env=environment)
            now = Lease.objects.db_now_ms()
            due = WorkflowRun.objects.filter(pk__in=[r.pk for r in runs], status="running", wake_at__lte=now)
            if not due.exists():
                return
        raise AssertionError("the runs never settled")

    def test_runs_in_flight_keep_their_path_under_a_v2_worker(self) -> None:
        with override_settings(PIKKU_CODE_VERSION="v1"):
            sleeping = start_workflow("test.deploy.tax", {"sleep_ms": 60_000})
            waiting = start_workflow("test.deploy.tax", {"signal": True})
            stable = start_workflow("test.deploy.moved", {"stable": True, "sleep_ms": 60_000})
            moved = start_workflow("test.deploy.moved", {"sleep_ms": 60_000})
        self.once("v1-worker", env=env("v1"))
        for run in (sleeping, waiting, stable, moved):
            run.refresh_from_db()
            assert run.status in ("running", "suspended") and called(run) in (["tax_v1"], ["charge"])
        for run in (sleeping, stable, moved):
            wake_sleep(run)
        send_signal(waiting.pk, "go")
        fresh = start_workflow("test.deploy.tax", {"sleep_ms": 1})
        self.drain("v2-worker", env("v2", PIKKU_ON_REPLAY_MISMATCH="park"), sleeping, waiting, stable, fresh)
        for run in (sleeping, waiting):
            run.refresh_from_db()
            assert run.status == "completed" and run.output["tax"] == "tax v1", run.error
            assert (run.code_version, run.driven_version) == ("v1", "v2")
            assert not WorkflowPatch.objects.filter(run=run).exists()
        fresh.refresh_from_db()
        assert fresh.status == "completed" and fresh.output["tax"] == "tax v2"
        assert list(WorkflowPatch.objects.filter(run=fresh).values_list("name", flat=True)) == ["tax-v2"]
        stable.refresh_from_db()
        assert stable.status == "completed" and called(stable) == ["charge", "receipt"]
        # Without an id the moved function's run is parked, naming both paths, and nothing wakes it.
        moved.refresh_from_db()
        assert (moved.status, moved.wake_at) == ("suspended", None)
        assert "charge_old_home" in moved.error["message"] and "charge_new_home" in moved.error["message"]
        assert called(moved) == ["charge"]
        # The code is fixed (here: v1's function again); retried, the run completes.
        assert retry_workflow(moved.pk) is True
        self.drain("fixed-worker", env("v1"), moved)
        moved.refresh_from_db()
        assert moved.status == "completed" and called(moved) == ["charge", "receipt"]
