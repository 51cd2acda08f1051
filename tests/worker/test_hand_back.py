"""
Runs taken ahead answer to the same fences as a run a lane takes alone: a
lane hands back (claim and run lease given back, due at once, no budget
spent) the runs it took ahead and has not started once its worker is
stopping, when the keeper cannot vouch for their leases, and, through the
flush loop, when they have waited longer than the run lease's ttl behind a
long run. A loop beside the lanes that raises is restarted.
"""

from __future__ import annotations

import threading
from typing import Any
from unittest import mock

from django.db import connections
from django.test import TransactionTestCase, override_settings

from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.store.takes import hand_back
from pikku_django.sweep import SweepReport
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker, poller
from pikku_django.worker.loops import SweepLoop
from testproject.testing import tasks
from testproject.testing.models import StepCall
from tests.support.ahead import SHORT_LEASE_MS, LongRunInHand, attempts_of
from tests.support.children import poll_until

BEHIND = 3


def handed_back(run_id: str) -> None:
    """``run_id`` is due at once, its run lease free, its step's attempt 1 waiting, no loss counted."""
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.wake_at) == ("running", 0), run_id
    assert Lease.objects.current(run.lease_key) is None, run_id
    step = WorkflowStep.objects.get(run_id=run_id)
    assert (step.status, step.attempt, step.losses, step.lease_expires_at) == ("scheduled", 1, 0, None)
    assert attempts_of(run_id) == [(1, "scheduled")], run_id


class HandBackTests(LongRunInHand):
    def behind(self) -> list[Any]:
        tasks.add.using(priority=3).enqueue(1, 1)
        return [tasks.note.using(priority=1).enqueue(f"behind-{i}") for i in range(BEHIND)]

    def drain(self, behind: list[Any]) -> None:
        """Another worker runs each run handed back once, as attempt 1."""
        Worker(holder="w-next", concurrency=1, batch=10, interval=0.01).run_batch()
        for result in behind:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id
            assert attempts_of(result.id) == [(1, "succeeded")], result.id
        labels = sorted(StepCall.objects.filter(step__startswith="behind-").values_list("step", flat=True))
        assert labels == [f"behind-{i}" for i in range(BEHIND)]

    def test_a_stopping_worker_starts_no_run_it_took_ahead(self) -> None:
        behind = self.behind()
        worker = Worker(holder="w-stop", concurrency=1, batch=10, interval=0.01)
        with self.long_run_in_hand(self.batch_of_short_passes(worker)):
            assert all(WorkflowStep.objects.get(run_id=r.id).status == "running" for r in behind)
            # The first SIGTERM, as the worker's handler takes it.
            worker.stop()
        assert not StepCall.objects.filter(step__startswith="behind-").exists()
        for result in behind:
            handed_back(result.id)
            result.refresh()
            assert result.status == TaskResultStatus.READY
        self.drain(behind)

    @override_settings(PIKKU_LEASE_TTL_MS=SHORT_LEASE_MS, PIKKU_STEP_LEASE_MS=SHORT_LEASE_MS)
    def test_a_run_taken_over_while_its_lane_was_held_up_is_not_run_again(self) -> None:
        behind = self.behind()
        worker = Worker(holder="w-paused", concurrency=1, batch=10, interval=0.01)
        taken_over = behind[0]
        with self.long_run_in_hand(self.batch_of_short_passes(worker)):
            # As after a pause past its leases: they lapse, and another worker takes the run over.
            run = WorkflowRun.objects.get(pk=taken_over.id)
            Lease.objects.filter(key=run.lease_key).update(expires_at=0)
            WorkflowStep.objects.filter(run_id=run.pk).update(lease_expires_at=0)
            WorkflowRun.objects.filter(pk=run.pk).update(wake_at=0)
            # Taken over, its step claimed again (attempt 2), and in hand there.
            other = Worker(holder="w-other", concurrency=1, interval=0.01).lanes[0]
            with override_settings(PIKKU_LEASE_TTL_MS=60_000):
                took = other.take(run.pk, 0)
            # A take never claims an attempt another take's worker lost: its pass does.
            assert took.lease is not None and took.claimed == {}, took
            lost = WorkflowStep.objects.get(run_id=run.pk)
            claimed = WorkflowStep.objects.claim(run.pk, "task", lost.rpc_name, 60_000, holder="w-other")
            assert claimed is not None and claimed.attempt == 2
            # The lost attempt was the take's: given back, no loss counted.
            assert (claimed.losses, claimed.budget_base, claimed.provisional) == (0, 1, False)
            # The keeper's next renewal (every third of the ttl) hears "not yours".
            done_at = Lease.objects.db_now_ms() + 2 * SHORT_LEASE_MS
            poll_until(lambda: Lease.objects.db_now_ms() > done_at, timeout=30)
        # The lane called nothing it no longer held, and left the other's claim alone.
        assert not StepCall.objects.filter(run_id=taken_over.id).exists()
        step = WorkflowStep.objects.get(run_id=taken_over.id)
        assert (step.status, step.attempt) == ("running", 2)
        lease = Lease.objects.current(run.lease_key)
        assert lease is not None and lease.token == took.lease.token
        for result in behind[1:]:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id

    @override_settings(PIKKU_LEASE_TTL_MS=SHORT_LEASE_MS)
    def test_runs_kept_waiting_past_the_run_lease_are_handed_back(self) -> None:
        behind = self.behind()
        worker = Worker(holder="w-held-up", concurrency=1, interval=0.01, sweep_interval=60)

        def run() -> None:
            with override_settings(PIKKU_TAKE_AHEAD_BELOW_MS=3_600_000):
                worker.run()

        def stop() -> None:
            poll_until(lambda: WorkflowRun.objects.filter(status="running").count() == 0, timeout=30)
            worker.stop()

        with self.long_run_in_hand(run, then=stop) as long:
            # The flush loop hands them back while the long run is in hand:
            # another worker runs them meanwhile.
            poll_until(lambda: WorkflowRun.objects.filter(pk=behind[-1].id, wake_at=0).exists(), timeout=10)
            for result in behind:
                handed_back(result.id)
            self.drain(behind)
            assert WorkflowRun.objects.get(pk=long.id).status == "running"

    def test_a_run_another_pass_holds_is_not_handed_back(self) -> None:
        tasks.add.enqueue(1, 1)
        worker = Worker(holder="w-guard", concurrency=1, interval=0.01)
        (run_id, wake_at, _), *_ = worker.due()
        took = worker.lanes[0].take(run_id, wake_at)
        assert took.lease is not None
        Lease.objects.filter(key=took.lease.key).update(token=took.lease.token + 1)
        assert hand_back("default", [took]) == 0
        assert WorkflowStep.objects.get(run_id=run_id).status == "running"
        assert WorkflowRun.objects.get(pk=run_id).wake_at != 0


class LoopRestartTests(TransactionTestCase):
    def test_a_loop_beside_the_lanes_that_raises_is_restarted(self) -> None:
        loop = SweepLoop(Worker(holder="w-restart", sweep_interval=0.01))
        calls: list[int] = []

        def sweep(**options: Any) -> SweepReport:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bad pass")
            loop.stop()
            return SweepReport()

        thread = threading.Thread(target=loop.run, daemon=True)
        with (
            mock.patch("pikku_django.worker.loops.sweep", side_effect=sweep),
            mock.patch.object(poller, "RESTART_PAUSE_S", 0.01),
            self.assertLogs("pikku_django.worker.poller", "WARNING") as logs,
        ):
            thread.start()
            thread.join(30)
        connections.close_all()
        assert not thread.is_alive() and len(calls) == 2
        assert "pikku-sweep raised RuntimeError: a bad pass; restarting it" in logs.output[0]

    def test_every_loop_beside_the_lanes_restarts_and_no_lane_does(self) -> None:
        worker = Worker(holder="w-loops", concurrency=2, sweep_interval=5, schedules=True)
        assert all(loop.restarts for loop in worker.loops())
        assert not any(lane.restarts for lane in worker.lanes)
