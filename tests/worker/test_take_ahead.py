"""
A lane going through a backlog of short runs takes several in one commit
(``take_run``'s ``ahead``), and writes their outcomes together with its
next take (issue 14): fewer commits than tasks. The runs taken ahead keep
their leases (run and step) through the process's keeper until their pass
starts, so a long run before them costs them time, never an attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from django.db import connection
from django.db.models import F
from django.test import TransactionTestCase, override_settings

from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.sweep import sweep
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker
from pikku_django.worker import ahead as worker_ahead
from pikku_django.workflows import cancel_workflow
from testproject.testing import tasks
from testproject.testing.models import StepCall
from tests.support.ahead import SHORT_LEASE_MS, LongRunInHand, attempts_of
from tests.support.children import poll_until
from tests.support.commits import counting_commits

TASKS = 10


@contextmanager
def every_pass_short() -> Iterator[None]:
    """Every pass counts as short and no held outcome as old: the lane takes ahead whenever it may."""
    with (
        override_settings(PIKKU_TAKE_AHEAD_BELOW_MS=3_600_000),
        mock.patch.object(worker_ahead, "HOLD_WINDOW_S", 3600),
    ):
        yield


class TakeAheadTests(LongRunInHand, TransactionTestCase):
    def test_a_lane_through_a_backlog_of_short_tasks_takes_several_in_one_commit(self) -> None:
        results = [tasks.add.enqueue(i, 1) for i in range(TASKS)]
        worker = Worker(holder="w-ahead", concurrency=1, batch=TASKS, interval=0.01)
        with counting_commits() as counter, every_pass_short():
            assert worker.run_batch() == TASKS
        # The first take finds no pass timed yet and takes one run; the
        # second takes a run and TAKE_AHEAD - 1 ahead, with the first's
        # outcome; the third the last run, with those 8 outcomes; the last
        # outcome goes alone.
        assert worker_ahead.TAKE_AHEAD == 8
        assert counter.commits == 4, counter.report()
        for i, result in enumerate(results):
            result.refresh()
            assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, i + 1)
            assert attempts_of(result.id) == [(1, "succeeded")]
            assert Lease.objects.current(f"workflow-run:{result.id}") is None

    def test_a_batch_takes_no_more_than_it_has_room_for(self) -> None:
        for i in range(TASKS):
            tasks.add.enqueue(i, 1)
        worker = Worker(holder="w-room", concurrency=1, batch=3, interval=0.01)
        with every_pass_short():
            assert worker.run_batch() == 3
        assert WorkflowRun.objects.filter(status="completed").count() == 3
        assert not Lease.objects.filter(
            key__startswith="workflow-run:", expires_at__gt=Lease.objects.db_now_ms()
        )

    def test_no_run_is_taken_ahead_while_no_more_is_due_than_the_worker_has_lanes(self) -> None:
        for i in range(4):
            tasks.add.enqueue(i, 1)
        worker = Worker(holder="w-lanes", concurrency=4, batch=4, interval=0.01)
        with counting_commits() as counter, every_pass_short():
            assert worker.run_batch() == 4
        # One take per run (each with the outcome before it), and the last outcome alone.
        assert counter.commits == 5, counter.report()

    def test_the_runs_taken_ahead_are_taken_and_claimed_together(self) -> None:
        for i in range(worker_ahead.TAKE_AHEAD):
            tasks.add.enqueue(i, 1)
        worker = Worker(holder="w-one-go", concurrency=1, interval=0.01)
        (run_id, wake_at, _), *rest = worker.due()
        sent: list[str] = []

        def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
            sent.append(sql)
            return execute(sql, *args)

        with connection.execute_wrapper(count):
            took = worker.lanes[0].take(
                run_id, wake_at, alternates=[(r, w) for r, w, _ in rest], ahead=len(rest)
            )
        assert len(took.ahead) == len(rest) == worker_ahead.TAKE_AHEAD - 1
        for each in (took, *took.ahead):
            assert each.run is not None and each.lease is not None and each.steps is not None
            assert Lease.objects.current(each.run.lease_key) == each.lease
            (step,) = each.steps
            assert each.claimed == {step.step_name: 1} and step.status == "running"
        if connection.vendor == "mysql":
            # The first run's take (with its run lease) and its claim, then
            # the others' takes and their claims, each in one round trip; the COMMIT.
            assert len(sent) == 5, sent

    def test_the_outcomes_a_lane_holds_are_written_together(self) -> None:
        results = [tasks.add.enqueue(i, 1) for i in range(worker_ahead.TAKE_AHEAD + 1)]
        worker = Worker(holder="w-together", concurrency=1, batch=len(results), interval=0.01)
        with every_pass_short():
            # One run, then TAKE_AHEAD taken ahead: their outcomes are held.
            assert worker.lanes[0].take_next(hold=True)
            assert worker.lanes[0].take_next(hold=True)
        sent: list[str] = []

        def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
            sent.append(sql)
            return execute(sql, *args)

        for result in results:
            result.refresh()
        assert [r.status for r in results].count(TaskResultStatus.RUNNING) == worker_ahead.TAKE_AHEAD
        # One of them was superseded meanwhile (its step claimed again): its
        # outcome alone is refused; the others' guards are their own.
        superseded = results[4]
        WorkflowStep.objects.filter(run_id=superseded.id).update(attempt=F("attempt") + 1)
        with connection.execute_wrapper(count):
            worker.lanes[0].flush()
        for i, result in enumerate(results):
            result.refresh()
            if result is superseded:
                assert result.status == TaskResultStatus.RUNNING
                assert WorkflowRun.objects.get(pk=result.id).status == "running"
            else:
                assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, i + 1)
            assert Lease.objects.current(f"workflow-run:{result.id}") is None
        if connection.vendor == "mysql":
            # Every pass's end in one round trip, the per-minute rollup's one
            # upsert for them all (store.rollup), and the COMMIT.
            assert len(sent) == 3, sent
            assert "pikku_workflow_minute" in sent[1], sent

    @override_settings(PIKKU_LEASE_TTL_MS=SHORT_LEASE_MS, PIKKU_STEP_LEASE_MS=SHORT_LEASE_MS)
    def test_runs_taken_ahead_keep_their_leases_behind_a_long_run(self) -> None:
        first = tasks.add.using(priority=3).enqueue(1, 1)
        behind = [tasks.add.using(priority=1).enqueue(i, 10) for i in range(2)]
        worker = Worker(holder="w-long", concurrency=1, batch=4, interval=0.01)
        with self.long_run_in_hand(self.batch_of_short_passes(worker)) as long:
            # The long run is in hand; the two behind it were taken with it.
            taken = {r.id: Lease.objects.current(f"workflow-run:{r.id}") for r in behind}
            assert all(lease is not None and lease.holder == "w-long" for lease in taken.values()), taken
            # Wait on the database clock until their first leases would have lapsed three times over.
            lapsed_at = max(lease.expires_at for lease in taken.values() if lease) + 2 * SHORT_LEASE_MS
            poll_until(lambda: Lease.objects.db_now_ms() > lapsed_at, timeout=30)
            for result in behind:
                lease = Lease.objects.current(f"workflow-run:{result.id}")
                assert lease is not None and lease.token == taken[result.id].token  # type: ignore[union-attr]
                claimed = WorkflowStep.objects.get(run_id=result.id)
                assert (claimed.status, claimed.attempt) == ("running", 1)
                assert claimed.lease_expires_at > Lease.objects.db_now_ms()
            # Nothing else takes them meanwhile: not the sweep, not another
            # worker (which finds their run leases held, and leaves them due later).
            sweep()
            Worker(holder="w-other", concurrency=1, batch=4, interval=0.01).run_batch()
            for result in [long, *behind]:
                assert attempts_of(result.id) == [(1, "running")], result.id
                lease = Lease.objects.current(f"workflow-run:{result.id}")
                assert lease is not None and lease.holder == "w-long", result.id
        for result in [first, long, *behind]:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id
            assert attempts_of(result.id) == [(1, "succeeded")], result.id

    def test_outcomes_held_behind_a_long_run_are_written_within_the_window(self) -> None:
        first = tasks.add.using(priority=4).enqueue(1, 1)
        short = tasks.add.using(priority=3).enqueue(2, 2)
        behind = [tasks.add.using(priority=1).enqueue(i, 10) for i in range(2)]
        worker = Worker(holder="w-window", concurrency=1, interval=0.01, sweep_interval=60)

        def run() -> None:
            # Every pass counts as short: the second take takes the long run
            # ahead, behind the short one whose outcome it then holds.
            with override_settings(PIKKU_TAKE_AHEAD_BELOW_MS=3_600_000):
                worker.run()

        def stop() -> None:
            poll_until(lambda: WorkflowRun.objects.filter(status="completed").count() == 5, timeout=30)
            worker.stop()

        with self.long_run_in_hand(run, then=stop) as long:
            # The short run's outcome, held for the lane's next take, is
            # written by the flush loop while the long run is in hand.
            poll_until(lambda: WorkflowRun.objects.get(pk=short.id).status == "completed", timeout=10)
            assert WorkflowRun.objects.get(pk=long.id).status == "running"
            assert Lease.objects.current(f"workflow-run:{short.id}") is None
        for result in [first, short, long, *behind]:
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL, result.id
            assert attempts_of(result.id) == [(1, "succeeded")], result.id

    def test_a_run_cancelled_while_taken_ahead_never_runs_its_task(self) -> None:
        tasks.add.using(priority=3).enqueue(1, 1)
        cancelled, kept = (tasks.note.using(priority=1).enqueue(label) for label in ("cancelled", "kept"))
        worker = Worker(holder="w-cancel", concurrency=1, batch=4, interval=0.01)
        with self.long_run_in_hand(self.batch_of_short_passes(worker)):
            # Taken with the long run, its step claimed: cancelled before its pass starts.
            assert WorkflowStep.objects.get(run_id=cancelled.id).status == "running"
            assert cancel_workflow(cancelled.id)
        assert list(StepCall.objects.values_list("step", flat=True)) == ["kept"]
        cancelled.refresh()
        kept.refresh()
        assert (cancelled.status, kept.status) == (TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL)
        assert WorkflowRun.objects.get(pk=cancelled.id).status == "cancelled"
