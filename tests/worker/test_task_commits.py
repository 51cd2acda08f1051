"""
What a lone task costs: the durable commits of one no-op task through a
worker pass, counted on the worker's connection (issue 14: the take claims
the task's step in its commit, and the outcome, the run's end and the
release are one more, for a success and a failure alike). And what a take
that loses costs: nothing written, not even a transaction id on PostgreSQL.

A commit is a COMMIT that ends a transaction which wrote (Django's own, or
one opened by ``START TRANSACTION``/``BEGIN`` and sent as statements), or a
writing statement run in autocommit, which is a transaction of its own.
"""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test import TransactionTestCase, skipUnlessDBFeature

from pikku_django.conf import conf
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.store.takes import take_run
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.worker import Worker
from pikku_django.workflows.registry import first_step_of
from testproject.testing import tasks
from tests.support.commits import (
    BEGIN,
    END,
    LONE_TASK_COMMITS,
    LONE_TASK_READS,
    SAVEPOINT,
    WRITES,
    counting_commits,
)


class LoneTaskCommitTests(TransactionTestCase):
    def test_a_lone_no_op_task_costs_two_durable_commits(self) -> None:
        result = tasks.add.enqueue(2, 3)
        worker = Worker(holder="w-commits", once=True, interval=0.01)
        with counting_commits() as counter:
            assert worker.lanes[0].drive_next() is True
        result.refresh()
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert counter.commits == LONE_TASK_COMMITS, counter.report()
        # And it reads only what its writes do not return.
        reads = [
            text
            for text in counter.statements
            if not (WRITES.search(text) or BEGIN.match(text) or END.match(text) or SAVEPOINT.match(text))
        ]
        assert len(reads) == LONE_TASK_READS[connection.vendor], counter.report()
        # Every guarantee's trace is there: the attempt's history, the run lease released.
        attempt = WorkflowStepAttempt.objects.get(step__run_id=result.id)
        assert (attempt.attempt, attempt.status, attempt.holder) == (1, "succeeded", "w-commits")
        assert Lease.objects.current(f"workflow-run:{result.id}") is None
        assert Lease.objects.get(key=f"workflow-run:{result.id}").holder == "w-commits"

    def test_a_lone_failed_task_costs_two_durable_commits(self) -> None:
        result = tasks.explode.enqueue("boom")
        worker = Worker(holder="w-commits", once=True, interval=0.01)
        with counting_commits() as counter:
            assert worker.lanes[0].drive_next() is True
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
        assert counter.commits == LONE_TASK_COMMITS, counter.report()
        attempt = WorkflowStepAttempt.objects.get(step__run_id=result.id)
        assert (attempt.attempt, attempt.status, attempt.holder) == (1, "failed", "w-commits")
        assert attempt.failed_at is not None
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.status, step.attempt, step.lease_expires_at) == ("failed", 1, None)
        assert WorkflowRun.objects.get(pk=result.id).error["type"] == "builtins.ValueError"
        assert Lease.objects.current(f"workflow-run:{result.id}") is None

    def test_a_task_failed_with_retries_left_commits_each_attempt_then_fails_in_the_pass(self) -> None:
        result = tasks.flaky.enqueue(succeed_on=10)
        worker = Worker(holder="w-commits", once=True, interval=0.01)
        assert worker.lanes[0].drive_next() is True
        result.refresh()
        assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 3)
        attempts = WorkflowStepAttempt.objects.filter(step__run_id=result.id).order_by("attempt")
        assert [(a.attempt, a.status) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "failed")]


def _take(run: WorkflowRun, holder: str) -> Any:
    return take_run(
        DEFAULT_DB_ALIAS, run.pk, run.wake_at, holder, conf.LEASE_TTL_MS, 1_000, first_step=first_step_of
    )


class TakeClaimTests(TransactionTestCase):
    def test_the_take_claims_a_tasks_step_with_its_attempt_row(self) -> None:
        result = tasks.add.enqueue(2, 3)
        took = _take(WorkflowRun.objects.get(pk=result.id), "w-take")
        assert took.taken and took.lease is not None and took.claimed == {"task": 1}
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.status, step.attempt) == ("running", 1)
        assert step.lease_expires_at is not None
        assert WorkflowStepAttempt.objects.get(step=step).holder == "w-take"

    def test_a_take_whose_claim_is_refused_takes_the_run_and_claims_nothing(self) -> None:
        result = tasks.add.enqueue(2, 3)
        # Another worker holds the step under a live lease.
        WorkflowStep.objects.claim_attempt(result.id, "task", "testproject.testing.tasks.add", 60_000)
        took = _take(WorkflowRun.objects.get(pk=result.id), "w-take")
        assert took.taken and took.lease is not None and took.claimed == {}
        assert WorkflowStepAttempt.objects.filter(step__run_id=result.id).count() == 1

    def test_a_task_whose_path_names_no_task_is_taken_without_a_claim(self) -> None:
        result = tasks.add.enqueue(2, 3)
        run = WorkflowRun.objects.get(pk=result.id)
        WorkflowRun.objects.filter(pk=run.pk).update(input={**run.input, "task": "testproject.nowhere.add"})
        took = _take(run, "w-take")
        assert took.taken and took.lease is not None and took.claimed == {}
        assert WorkflowStep.objects.get(run_id=result.id).status == "pending"

    def test_a_workflow_run_is_taken_without_a_claim(self) -> None:
        run = WorkflowRun.objects.create_run("test.steps")
        took = _take(run, "w-take")
        assert took.taken and took.run is not None and took.claimed == {}


class TakeLeaseTests(TransactionTestCase):
    """A take's run lease keeps the acquire's rules, taken alone or ahead (on MariaDB in the take's batch)."""

    def test_a_run_whose_lease_another_pass_holds_is_left_due_a_little_later(self) -> None:
        run = WorkflowRun.objects.get(pk=tasks.add.enqueue(2, 3).id)
        held = Lease.objects.acquire(run.lease_key, "other-pass", 60_000)
        assert held is not None
        before = Lease.objects.db_now_ms()
        took = _take(run, "w-take")
        assert took.taken and took.lease is None and took.claimed == {}
        # Not this take's: the lease is as it was, and the run due again 1 s on.
        assert Lease.objects.current(run.lease_key) == held
        wake_at = WorkflowRun.objects.get(pk=run.pk).wake_at
        assert wake_at is not None and before + 1_000 <= wake_at <= Lease.objects.db_now_ms() + 1_000
        assert WorkflowStepAttempt.objects.filter(step__run_id=run.pk).count() == 0

    def test_a_lapsed_lease_of_another_holder_is_taken_with_a_new_token(self) -> None:
        run = WorkflowRun.objects.get(pk=tasks.add.enqueue(2, 3).id)
        lapsed = Lease.objects.acquire(run.lease_key, "gone", 60_000)
        assert lapsed is not None
        Lease.objects.filter(key=run.lease_key).update(expires_at=Lease.objects.db_now_ms() - 1)
        took = _take(run, "w-take")
        assert took.lease is not None and took.claimed == {"task": 1}
        assert (took.lease.holder, took.lease.token) == ("w-take", lapsed.token + 1)
        assert Lease.objects.current(run.lease_key) == took.lease

    def test_the_runs_taken_ahead_pass_over_those_held_elsewhere(self) -> None:
        runs = [WorkflowRun.objects.get(pk=tasks.add.enqueue(i, 1).id) for i in range(5)]
        # The third's run lease is another pass's; the fourth was taken by another lane since the look.
        assert Lease.objects.acquire(runs[2].lease_key, "other-pass", 60_000) is not None
        WorkflowRun.objects.filter(pk=runs[3].pk).update(wake_at=Lease.objects.db_now_ms() + 60_000)
        took = take_run(
            DEFAULT_DB_ALIAS,
            runs[0].pk,
            runs[0].wake_at,
            "w-ahead",
            conf.LEASE_TTL_MS,
            1_000,
            first_step=first_step_of,
            alternates=[(run.pk, run.wake_at) for run in runs[1:]],
            ahead=4,
        )
        assert took.run_id == runs[0].pk and took.claimed == {"task": 1}
        assert [more.run_id for more in took.ahead] == [runs[1].pk, runs[4].pk]
        for more in took.ahead:
            assert more.lease is not None and more.lease.holder == "w-ahead" and more.claimed == {"task": 1}
            assert Lease.objects.current(more.lease.key) == more.lease
        assert Lease.objects.current(runs[2].lease_key).holder == "other-pass"  # type: ignore[union-attr]
        assert not WorkflowStepAttempt.objects.filter(step__run_id__in=[runs[2].pk, runs[3].pk]).exists()


class SkippingTakeTests(TransactionTestCase):
    """Lanes woken together: a take skips a run another lane holds, and writes nothing."""

    def lock_elsewhere(self, run: WorkflowRun) -> Any:
        """
        Another connection holding the run's row, as a lane mid-take does. A
        take that waited on it would wait for good (the holder is this
        thread): this connection gives up after 3 s instead, and fails.
        """
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET lock_timeout = '3s'")
            elif connection.vendor == "mysql":
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 3")
        other = connections.create_connection(DEFAULT_DB_ALIAS)
        other.set_autocommit(False)
        table = other.ops.quote_name(WorkflowRun._meta.db_table)
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {table} WHERE id = %s FOR UPDATE",  # noqa: S608  (a table name, no values)
                [WorkflowRun._meta.pk.get_db_prep_value(run.pk, other)],
            )
        return other

    @skipUnlessDBFeature("has_select_for_update_skip_locked")
    def test_a_run_another_lane_is_taking_is_skipped_at_once(self) -> None:
        run = WorkflowRun.objects.get(pk=tasks.add.enqueue(2, 3).id)
        other = self.lock_elsewhere(run)
        try:
            started = time.monotonic()
            assert _take(run, "w-loser").taken is False
            # Not waited for: the lock is held until the rollback below.
            assert time.monotonic() - started < 5
        finally:
            other.rollback()
            other.close()
        assert WorkflowStepAttempt.objects.filter(step__run_id=run.pk).count() == 0
        assert _take(run, "w-winner").claimed == {"task": 1}

    @skipUnlessDBFeature("has_select_for_update_skip_locked")
    def test_a_lane_whose_first_run_is_skipped_drives_the_next(self) -> None:
        first = tasks.add.enqueue(1, 1)
        second = tasks.add.enqueue(2, 2)
        other = self.lock_elsewhere(WorkflowRun.objects.get(pk=first.id))
        try:
            worker = Worker(holder="w-next", once=True, interval=0.01)
            assert worker.lanes[0].drive_next() is True
        finally:
            other.rollback()
            other.close()
        first.refresh()
        second.refresh()
        assert (first.status, second.status) == (TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL)

    def test_a_lost_take_takes_no_transaction_id_on_postgresql(self) -> None:
        if connection.vendor != "postgresql":
            self.skipTest("pg_current_xact_id_if_assigned() is PostgreSQL's")
        run = WorkflowRun.objects.get(pk=tasks.add.enqueue(2, 3).id)
        xids: list[Any] = []
        real_commit = connection.commit

        def probe_then_commit() -> None:
            # What the take's transaction was assigned, read in it just before its COMMIT.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_current_xact_id_if_assigned()")
                xids.append(cursor.fetchone()[0])
            real_commit()

        other = self.lock_elsewhere(run)
        try:
            with mock.patch.object(connection, "commit", probe_then_commit):
                assert _take(run, "w-loser").taken is False
        finally:
            other.rollback()
            other.close()
        # Another lane took the run meanwhile: the loser's guard no longer matches.
        stale = WorkflowRun.objects.get(pk=run.pk)
        assert _take(run, "w-winner").taken is True
        with mock.patch.object(connection, "commit", probe_then_commit):
            assert _take(stale, "w-late").taken is False
            assert _take(WorkflowRun.objects.get(pk=run.pk), "w-late").taken is True
        # The two losers wrote nothing; the probe sees the winner's id.
        assert xids[0] is None and xids[1] is None and xids[2] is not None
