"""
A lane going from run to run pays one commit per run: the outcome of its
last pass is held for its next take and commits with it (issue 14). Held,
it is reported nowhere; a lane with nothing to take writes it alone; a
held outcome that is lost (a crash) costs only a new attempt, and one whose
run lease passed on meanwhile is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import F
from django.test import TransactionTestCase, override_settings

from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import sweep
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker
from testproject.testing import tasks
from tests.support.commits import LONE_TASK_COMMITS, counting_commits
from tests.support.factories import lapse, lapse_step

TASKS = 10


def attempts_of(result_id: str) -> list[tuple[int, str]]:
    rows = WorkflowStepAttempt.objects.filter(step__run_id=result_id).order_by("attempt")
    return list(rows.values_list("attempt", "status"))


def held_task() -> tuple[Any, Worker, str]:
    """A task driven by a one-lane worker that holds its outcome for its next take."""
    result = tasks.add.enqueue(2, 3)
    worker = Worker(holder="w-held", concurrency=1, interval=0.01)
    holder = worker.lane_holder(0)
    assert worker.lanes[0].take_next(hold=True) is True
    return result, worker, holder


def run_again_elsewhere(result: Any) -> None:
    """The held task's leases lapse, and another worker runs it again."""
    lapse(f"workflow-run:{result.id}")
    lapse_step(WorkflowStep.objects.get(run_id=result.id))
    sweep()
    other = Worker(holder="w-other", concurrency=1, interval=0.01)
    assert other.run_batch() == 1


class HeldOutcomeTests(TransactionTestCase):
    def test_a_lane_through_a_backlog_pays_one_commit_per_task_and_one_for_the_last_outcome(self) -> None:
        results = [tasks.add.enqueue(i, 1) for i in range(TASKS)]
        # Every pass counts as long: no take takes runs ahead (test_take_ahead.py).
        worker = Worker(holder="w-held", concurrency=1, batch=TASKS, interval=0.01)
        with counting_commits() as counter, override_settings(PIKKU_TAKE_AHEAD_BELOW_MS=0):
            assert worker.run_batch() == TASKS
        # Each take carries the outcome before it; the last outcome goes alone.
        assert counter.commits == TASKS + 1, counter.report()
        for i, result in enumerate(results):
            result.refresh()
            assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, i + 1)
            assert attempts_of(result.id) == [(1, "succeeded")]
            assert Lease.objects.current(f"workflow-run:{result.id}") is None

    def test_a_lone_task_still_costs_its_two_commits(self) -> None:
        result = tasks.add.enqueue(2, 3)
        worker = Worker(holder="w-held", concurrency=1, interval=0.01)
        with counting_commits() as counter:
            assert worker.run_batch() == 1
        assert counter.commits == LONE_TASK_COMMITS, counter.report()
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL

    def test_a_held_outcome_is_reported_nowhere_until_it_commits(self) -> None:
        result, worker, holder = held_task()
        # The task ran; its outcome waits for the lane's next take.
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert WorkflowRun.objects.get(pk=result.id).status == "running"
        assert WorkflowStep.objects.get(run_id=result.id).status == "running"
        worker.lanes[0].flush()
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert Lease.objects.current(f"workflow-run:{result.id}") is None

    def test_a_take_that_loses_its_run_to_another_lane_takes_the_next_in_the_same_commit(self) -> None:
        results = {uuid.UUID(r.id): r for r in (tasks.add.enqueue(i, i) for i in (1, 2, 3))}
        worker = Worker(holder="w-held", concurrency=1, interval=0.01)
        assert worker.lanes[0].take_next(hold=True) is True
        # Tasks enqueued within one millisecond are due at the same instant,
        # in no set order: the two left are named by the look's order.
        due = worker.due()
        assert len(due) == 2
        (second, wake_at, _), (third, third_wake_at, _) = due
        (first,) = set(results) - {second, third}
        # Another lane takes the second task between this lane's look and its take.
        WorkflowRun.objects.filter(pk=second).update(wake_at=F("wake_at") + 60_000)
        with counting_commits() as counter:
            took = worker.lanes[0].take(second, wake_at, alternates=[(third, third_wake_at)])
        # One commit: the first task's held outcome, the second's take refused, the third's taken.
        assert counter.commits == 1, counter.report()
        assert took.taken and took.run_id == third and took.run is not None
        assert took.run.pk == third and took.lease is not None
        results[first].refresh()
        assert results[first].status == TaskResultStatus.SUCCESSFUL
        assert WorkflowStep.objects.get(run_id=third).status == "running"
        assert WorkflowStep.objects.get(run_id=second).status == "pending"

    def test_the_next_take_commits_the_held_outcome(self) -> None:
        first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
        worker = Worker(holder="w-held", concurrency=1, interval=0.01)
        assert worker.lanes[0].take_next(hold=True) is True
        with counting_commits() as counter:
            assert worker.lanes[0].take_next(hold=True) is True
        # One commit: the second task's take with the first's outcome.
        assert counter.commits == 1, counter.report()
        first.refresh()
        second.refresh()
        assert first.status == TaskResultStatus.SUCCESSFUL
        assert second.status == TaskResultStatus.RUNNING
        worker.lanes[0].flush()
        second.refresh()
        assert (second.status, second.return_value) == (TaskResultStatus.SUCCESSFUL, 4)

    def test_a_lost_held_outcome_costs_a_new_attempt_and_nothing_else(self) -> None:
        result, worker, holder = held_task()
        # The process dies holding it: the outcome is never written.
        worker.lanes[0].held.clear()
        run_again_elsewhere(result)
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert attempts_of(result.id) == [(1, "running"), (2, "succeeded")]

    def test_a_held_outcome_whose_run_passed_on_is_refused(self) -> None:
        result, worker, holder = held_task()
        # Its leases lapse before the lane writes it, and another worker runs the task again.
        run_again_elsewhere(result)
        done = WorkflowRun.objects.get(pk=result.id)
        worker.lanes[0].flush()
        # The late outcome changed nothing: the run and its step are the second attempt's.
        after = WorkflowRun.objects.get(pk=result.id)
        assert (after.status, after.updated_at, after.output) == ("completed", done.updated_at, done.output)
        assert attempts_of(result.id) == [(1, "running"), (2, "succeeded")]
        assert WorkflowStep.objects.get(run_id=result.id).attempt == 2

    def test_a_held_outcome_whose_run_passed_on_is_refused_by_the_next_take_too(self) -> None:
        # Written ahead of the next take, in its statement or round trip
        # (sql.ends): the step's outcome is fenced to its attempt, the run's
        # to its lease and to the step's, the release to its token.
        result, worker, holder = held_task()
        run_again_elsewhere(result)
        done = WorkflowRun.objects.get(pk=result.id)
        lease = Lease.objects.get(key=f"workflow-run:{result.id}")
        following = tasks.add.enqueue(3, 4)
        with self.assertLogs("pikku_django.store.passes", "WARNING") as logs:
            assert worker.lanes[0].take_next(hold=True) is True
        assert any("superseded" in line for line in logs.output), logs.output
        after = WorkflowRun.objects.get(pk=result.id)
        assert (after.status, after.updated_at, after.output) == ("completed", done.updated_at, done.output)
        assert attempts_of(result.id) == [(1, "running"), (2, "succeeded")]
        # The other pass's lease is as that pass left it.
        assert Lease.objects.get(key=f"workflow-run:{result.id}") == lease
        assert Lease.objects.get(key=f"workflow-run:{result.id}").expires_at == lease.expires_at
        worker.lanes[0].flush()
        following.refresh()
        assert (following.status, following.return_value) == (TaskResultStatus.SUCCESSFUL, 7)

    def test_a_held_outcome_whose_run_lease_passed_on_writes_the_step_and_not_the_run(self) -> None:
        result, worker, holder = held_task()
        # Only the run lease lapses, and another holder takes it: the step's
        # attempt is still this pass's, the run is not.
        key = f"workflow-run:{result.id}"
        lapse(key)
        assert Lease.objects.acquire(key, "w-other", 60_000) is not None
        following = tasks.add.enqueue(3, 4)
        assert worker.lanes[0].take_next(hold=True) is True
        run = WorkflowRun.objects.get(pk=result.id)
        assert run.status == "running" and run.output is None
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.status, step.attempt, step.result) == ("succeeded", 1, 5)
        assert attempts_of(result.id) == [(1, "succeeded")]
        assert Lease.objects.current(key).holder == "w-other"
        worker.lanes[0].flush()
        following.refresh()
        assert following.status == TaskResultStatus.SUCCESSFUL

    def test_a_held_outcome_whose_step_was_claimed_again_ends_nothing_but_its_lease(self) -> None:
        result, worker, holder = held_task()
        # The step's attempt is superseded while the run lease is still this pass's.
        step = WorkflowStep.objects.get(run_id=result.id)
        lapse_step(step)
        again = WorkflowStep.objects.claim(result.id, step.step_name, step.rpc_name, 60_000, holder="w-other")
        assert again is not None and again.attempt == 2
        key = f"workflow-run:{result.id}"
        assert Lease.objects.current(key).holder == holder
        following = tasks.add.enqueue(3, 4)
        with self.assertLogs("pikku_django.store.passes", "WARNING") as logs:
            assert worker.lanes[0].take_next(hold=True) is True
        assert any("superseded" in line for line in logs.output), logs.output
        run = WorkflowRun.objects.get(pk=result.id)
        assert run.status == "running" and run.output is None
        assert attempts_of(result.id) == [(1, "running"), (2, "running")]
        # The run lease is let go all the same: the pass is over.
        assert Lease.objects.current(key) is None
        worker.lanes[0].flush()
        following.refresh()
        assert following.status == TaskResultStatus.SUCCESSFUL
