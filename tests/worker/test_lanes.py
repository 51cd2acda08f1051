"""
The worker's lanes, its wake-ups and its name, with real ``pikku_worker``
processes on the test database.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sql.notify import looks_for_lanes
from pikku_django.worker import Lane, Worker
from pikku_django.worker import poller as loops
from pikku_django.worker.poller import Poller
from pikku_django.worker.watchers import LANE_FALLBACK_S
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import LONG_RUN_LEASE_MS, ProcessTestCase, attempts, status

pytestmark = pytest.mark.slow


def _spans(runs: list[WorkflowRun]) -> list[tuple[float, float, str]]:
    """(running_at, succeeded_at, holder) of each run's one step, on the database clock."""
    rows = WorkflowStepAttempt.objects.filter(step__run__in=runs, status="succeeded")
    return [(a.running_at.timestamp(), a.succeeded_at.timestamp(), a.holder) for a in rows]


class LaneProcessTests(ProcessTestCase):
    def test_lanes_drive_runs_at_once_each_under_its_own_name(self) -> None:
        runs = [start_workflow("test.slow_steps", {"steps": 1, "ms": 1500}) for _ in range(4)]
        proc = self.command("pikku_worker", "--once", "--concurrency", "4", "--holder", "lanes")
        code, out = self.exits(proc, timeout=60)
        assert code == 0, self.log(proc)
        assert [status(run) for run in runs] == ["completed"] * 4
        spans = _spans(runs)
        assert len(spans) == 4
        # Every step started before any of them ended: four at once.
        assert max(start for start, _, _ in spans) < min(end for _, end, _ in spans)
        assert sorted(holder for _, _, holder in spans) == ["lanes", "lanes/2", "lanes/3", "lanes/4"]

    def test_sigterm_lets_every_lane_finish_its_step_then_exits_0(self) -> None:
        runs = [start_workflow("test.slow_steps", {"steps": 2, "ms": 1500}) for _ in range(3)]
        proc = self.worker("term", "--concurrency", "3", "--interval", "0.05")
        poll_until(
            lambda: WorkflowStepAttempt.objects.filter(step__run__in=runs, status="running").count() == 3,
            timeout=30,
        )
        passes = self.stop(proc, "term")
        assert passes == 3
        # Each lane finished the step in hand (s0) and started no other.
        done = WorkflowStepAttempt.objects.filter(step__run__in=runs)
        assert sorted(done.values_list("step__step_name", "status")) == [("s0", "succeeded")] * 3
        # The runs are left due for the next worker.
        assert all(status(run) == "running" for run in runs)
        proc = self.command("pikku_worker", "--once", "--concurrency", "3", "--holder", "next")
        assert self.exits(proc, timeout=60)[0] == 0, self.log(proc)
        assert [status(run) for run in runs] == ["completed"] * 3

    def test_every_step_of_a_sigkilled_worker_is_recovered_by_the_sweep_in_another_worker(self) -> None:
        # Run leases of a minute: only a sweep brings the runs back soon.
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        runs = [start_workflow("test.blocker", {"lease_ms": 1500}) for _ in range(3)]
        victim = self.worker("victim", "--concurrency", "3", "--interval", "0.05", env=env)
        poll_until(lambda: StepCall.objects.filter(step="block").count() == 3, timeout=30)
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        # The rescuer's own sweep finds the lapsed steps, frees their runs and
        # its lanes take each step again, long before the run leases lapse.
        rescuer = self.worker(
            "rescuer", "--concurrency", "3", "--interval", "0.05", "--sweep-interval", "0.5", env=env
        )
        poll_until(lambda: all(status(run) == "completed" for run in runs), timeout=30)
        self.stop(rescuer, "rescuer")
        for run in runs:
            step = WorkflowStep.objects.get(run=run, step_name="block")
            assert attempts(step) == [(1, "running"), (2, "succeeded")]
            assert WorkflowRun.objects.get(pk=run.pk).output == {"block": {"call": 2}}

    def test_a_second_worker_with_the_same_name_refuses_to_start(self) -> None:
        first = self.worker("twin", "--interval", "0.05")
        second = self.command("pikku_worker", "--holder", "twin")
        code, _ = self.exits(second, timeout=60)
        assert code == 1
        assert "Another live worker is named 'twin'" in self.log(second)
        self.stop(first, "twin")
        # Once the first is gone, the name is free again.
        again = self.command("pikku_worker", "--once", "--holder", "twin")
        assert self.exits(again, timeout=60)[0] == 0, self.log(again)

    def test_an_idle_worker_with_a_long_interval_is_woken_by_a_start(self) -> None:
        # PostgreSQL: the NOTIFY; SQLite: the file watcher; MariaDB: the due look.
        proc = self.worker("listener", "--interval", "60", "--no-sweep")
        took = []
        for _ in range(3):
            started = time.monotonic()
            run = start_workflow("test.noop", {"n": 1})
            poll_until(lambda run=run: status(run) == "completed", timeout=10)
            took.append(time.monotonic() - started)
        self.stop(proc, "listener")
        # Far inside the 60 s interval (the lanes' own looks; on MariaDB they
        # look only every 60 s too): each start woke the worker.
        assert max(took) < 2, took


class WakeUpTests(ProcessTestCase):
    """Wake-ups within one process, on every database."""

    def test_an_idle_lane_is_woken_by_a_start_in_its_process(self) -> None:
        worker = Worker(holder="in-process", interval=60, concurrency=2)

        def run() -> None:
            try:
                worker.run()
            finally:
                # This thread's own connection (the worker's name lease) is ours to close.
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            # Both lanes found nothing and wait out their 60 s interval.
            poll_until(lambda: len(worker.lanes) == 2 and all(lane.idle for lane in worker.lanes), timeout=10)
            started = time.monotonic()
            run = start_workflow("test.noop", {"n": 1})
            poll_until(lambda: status(run) == "completed", timeout=10)
            assert time.monotonic() - started < 5
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()

    def test_idle_lanes_take_turns_to_look(self) -> None:
        worker = Worker(holder="turns", interval=2, concurrency=4)
        lanes = [Lane(worker, index) for index in range(4)]
        # On MariaDB the lanes' own looks are a fallback behind the due look.
        every = worker.lane_interval()
        assert every == (LANE_FALLBACK_S if looks_for_lanes("default") else 2)
        assert [lane.phase for lane in lanes] == [0, every / 4, every / 2, every * 3 / 4]
        for lane in lanes:
            # Each idle wait ends on the lane's own turn of the shared clock, so
            # the four lanes look every quarter interval between them, not together.
            wait = lane.idle_wait()
            assert 0 < wait <= every
            turn = (time.monotonic() + wait - loops.SHARED_CLOCK - lane.phase) % every
            assert min(turn, every - turn) < 0.05, (lane.phase, turn)
        # A loop with no phase waits its whole interval.
        assert Poller("plain", interval=2).idle_wait() == 2

    def test_a_rolled_back_start_announces_nothing(self) -> None:
        if connection.vendor != "postgresql":
            pytest.skip("NOTIFY is PostgreSQL's")
        listener = connection.get_new_connection(connection.get_connection_params())
        listener.autocommit = True
        listener.execute("LISTEN pikku_work")
        try:
            try:
                with transaction.atomic():
                    start_workflow("test.noop", {"n": 1})
                    start_workflow("test.noop", {"n": 2})
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
            with transaction.atomic():
                start_workflow("test.noop", {"n": 3})
                start_workflow("test.noop", {"n": 4})
            heard = list(listener.notifies(timeout=5, stop_after=1))
            heard += list(listener.notifies(timeout=0.5))
            # One notification: the committed transaction's, sent once for two starts.
            assert [n.channel for n in heard] == ["pikku_work"]
        finally:
            listener.close()
