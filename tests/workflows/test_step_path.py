"""
The runtime's step path (issues #9 and #14): a first-run step in one commit
in a pass (its start carries the success of the step before it), a replay in
none, prepared statements on PostgreSQL, the keeper, the worker's connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock, skipIf, skipUnless

import pytest
from django.db import OperationalError, connection, connections
from django.test import TransactionTestCase

from pikku_django import sql
from pikku_django.errors import StepFunctionMismatchError, StepSupersededError
from pikku_django.managers import WorkflowStepManager
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.worker import Worker, refresh_connections
from pikku_django.workflows import start_workflow
from pikku_django.workflows.context import StepLeaseRenewal
from tests.support.children import poll_until
from tests.support.factories import lapse_step, make_run

LEASE = 60_000
WRITES = ("INSERT", "UPDATE", "DELETE")


class Counter:
    """Statements, and durable commits among them (a write in autocommit, or a COMMIT)."""

    def __init__(self) -> None:
        self.statements = 0
        self.commits = 0
        self.explicit = False

    def __call__(self, execute: Callable[..., Any], text: str, params: Any, many: bool, context: Any) -> Any:
        self.statements += 1
        words = text.lstrip().upper()
        if words.startswith("START TRANSACTION") and words.rstrip().endswith("COMMIT"):
            self.commits += 1  # a whole transaction in one round trip (MySQL/MariaDB)
        elif words.startswith(("START TRANSACTION", "BEGIN")):
            self.explicit = True
        elif words.startswith(("COMMIT", "ROLLBACK")):
            self.commits += int(words.startswith("COMMIT") and self.explicit)
            self.explicit = False
        elif not self.explicit and not connection.in_atomic_block:
            cte_writes = words.startswith("WITH") and any(w in words for w in WRITES)
            self.commits += int(words.startswith(WRITES) or cte_writes)
        return execute(text, params, many, context)


@contextmanager
def counted() -> Iterator[Counter]:
    counter = Counter()
    wrapper = connections["default"]
    real_commit = wrapper._commit

    def commit() -> None:
        counter.commits += 1
        counter.explicit = False
        real_commit()

    wrapper.__dict__["_commit"] = commit
    try:
        with wrapper.execute_wrapper(counter):
            yield counter
    finally:
        wrapper.__dict__.pop("_commit", None)


def drive_counted(run_id: Any) -> Counter:
    """One pass of the run through the worker loop (due query, take, pass), counted."""
    WorkflowRun.objects.filter(pk=run_id).update(status="running", wake_at=0, output=None)
    with counted() as counter:
        assert Worker(once=True, batch=1).run_batch() == 1
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    return counter


#: Statements (round trips) per first-run step of a pass: one commit, the
#: step's start with the success of the step before it. PostgreSQL one
#: statement; MySQL and MariaDB one batch (START TRANSACTION, the outcome
#: and the start with their history rows, COMMIT); SQLite BEGIN and four
#: writes (the first step's start has no outcome before it and sends two
#: fewer, the last step's outcome rides in the run's outcome's transaction
#: and sends two). The start carries the run's state (active, not past its
#: deadline) in its guard, so no read of the run precedes the step's function.
FIRST_RUN_STATEMENTS = {"postgresql": 1, "mariadb": 1, "mysql": 1, "sqlite": 5}

#: The last step's outcome, sent inside the run's outcome's transaction: one
#: statement (PostgreSQL) or batch (MySQL/MariaDB); on SQLite counted above.
LAST_OUTCOME_STATEMENTS = {"postgresql": 1, "mariadb": 1, "mysql": 1, "sqlite": 0}

#: Statements per pass of a run with nothing to run: the due query, the take
#: with its run lease (one transaction: on SQLite its BEGIN besides, on
#: MySQL and MariaDB its COMMIT, its START TRANSACTION riding with its first
#: statement, and the take is one batch that locks the run unless another
#: lane holds it, moves it and reads it back: sql.MYSQL_RUN_TAKE_LOCK; on
#: MariaDB the run lease rides in that batch, sql.runs.MARIADB_RUN_TAKE_LEASE),
#: the steps' read, and the outcome with the lease's release and the
#: per-minute rollup's upsert (one transaction likewise; the upsert is one
#: statement of its own, store.rollup).
PASS_STATEMENTS = {"postgresql": 7, "mariadb": 8, "mysql": 9, "sqlite": 9}


class StepCountTests(TransactionTestCase):
    def test_first_run_step_one_commit_replay_nothing(self) -> None:
        counts = {}
        for steps in (0, 10):
            run = start_workflow("test.noop", {"steps": steps})
            counts[steps] = (drive_counted(run.pk), drive_counted(run.pk))
            assert WorkflowRun.objects.get(pk=run.pk).output == sum(range(steps))
        (empty, empty_replay), (full, full_replay) = counts[0], counts[10]
        # One commit a step: each start carries the success before it, and
        # the last step's success commits with the run's outcome.
        which = sql.variant(connection)
        assert (
            full.statements - empty.statements
            == 10 * FIRST_RUN_STATEMENTS[which] + LAST_OUTCOME_STATEMENTS[which]
        )
        assert full.commits - empty.commits == 10
        assert full_replay.statements == empty_replay.statements
        assert full_replay.commits == empty_replay.commits
        # Per pass: the take with its run lease, and the outcome with the release.
        assert empty.statements == PASS_STATEMENTS[which] and empty.commits == 2
        done = WorkflowStepAttempt.objects.filter(status="succeeded", succeeded_at__isnull=False)
        assert done.count() == 10

    def test_a_ten_step_no_op_pass_costs_one_commit_per_step_plus_its_own(self) -> None:
        run = start_workflow("test.noop", {"steps": 10})
        counter = drive_counted(run.pk)
        # The take with its run lease, ten step commits (each start with the
        # success before it), the outcome with the last success and the release.
        assert counter.commits == 10 + 2
        steps = WorkflowStep.objects.filter(run_id=run.pk)
        assert steps.count() == 10 and not steps.exclude(status="succeeded", attempt=1).exists()
        history = WorkflowStepAttempt.objects.filter(step__run_id=run.pk)
        assert sorted(history.values_list("attempt", "status")) == [(1, "succeeded")] * 10

    def test_a_replay_reads_the_steps_once(self) -> None:
        run = start_workflow("test.noop", {"steps": 5}, inline=True)
        assert run.status == "completed"
        replay = drive_counted(run.pk)
        assert replay.statements == PASS_STATEMENTS[sql.variant(connection)]


class FastPathTests(TransactionTestCase):
    def test_start_step_inserts_it_claimed_with_its_attempt_row(self) -> None:
        run = make_run()
        step = WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE, {"a": 1}, retries=2)
        assert step is not None and step.attempt == 1
        stored = WorkflowStep.objects.get(pk=step.pk)
        now = WorkflowStep.objects.annotate(n=sql_now()).get(pk=step.pk).n
        assert stored.status == "running" and stored.retries == 2 and stored.data == {"a": 1}
        assert now < stored.lease_expires_at <= now + LEASE
        (row,) = WorkflowStepAttempt.objects.filter(step=step)
        assert (row.attempt, row.status) == (1, "running") and row.running_at is not None
        assert WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE) is None
        assert WorkflowStep.objects.count() == 1

    def test_start_step_is_refused_for_a_run_cancelled_ended_or_past_its_deadline(self) -> None:
        from pikku_django.clock import DbNowMs

        for changes in ({"status": "cancelled"}, {"status": "completed"}, {"deadline_at": DbNowMs() - 1}):
            run = make_run()
            WorkflowRun.objects.filter(pk=run.pk).update(**changes)
            assert WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE) is None
            assert not WorkflowStep.objects.filter(run=run).exists()
            assert not WorkflowStepAttempt.objects.filter(step__run=run).exists()
        run = make_run()
        WorkflowRun.objects.filter(pk=run.pk).update(deadline_at=DbNowMs() + 60_000, status="suspended")
        assert WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE) is not None

    def test_claim_attempt_and_fenced_finish(self) -> None:
        run = make_run()
        step = WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE, retries=3)
        assert step is not None
        before = WorkflowStepAttempt.objects.get(step=step, attempt=1).running_at
        # A live lease: no claim, and its attempt row is not touched either.
        assert WorkflowStep.objects.claim_attempt(run.pk, "charge", "shop.charge", LEASE) is None
        assert WorkflowStepAttempt.objects.get(step=step, attempt=1).running_at == before
        with pytest.raises(StepFunctionMismatchError):
            WorkflowStep.objects.claim_attempt(run.pk, "charge", "shop.other", LEASE)
        lapse_step(step)
        assert WorkflowStep.objects.claim_attempt(run.pk, "charge", "shop.charge", LEASE) == 2
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.finish_attempt(step.pk, 1, result={"late": True})
        assert WorkflowStep.objects.get(pk=step.pk).status == "running"
        assert WorkflowStep.objects.finish_attempt(step.pk, 2, result={"k": (1, 2)}) == {"k": [1, 2]}
        stored = WorkflowStep.objects.get(pk=step.pk)
        assert (stored.status, stored.result, stored.lease_expires_at) == ("succeeded", {"k": [1, 2]}, None)
        rows = {r.attempt: r for r in WorkflowStepAttempt.objects.filter(step=step)}
        assert rows[1].status == "running" and rows[1].result is None
        assert rows[2].status == "succeeded" and rows[2].succeeded_at is not None
        assert rows[2].running_at is not None and rows[2].result == {"k": [1, 2]}
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.finish_attempt(step.pk, 2, error=RuntimeError("again"))

    def test_failed_attempt_is_recorded_and_retried(self) -> None:
        run = make_run()
        step = WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE, retries=1)
        assert step is not None
        WorkflowStep.objects.finish_attempt(step.pk, 1, error=RuntimeError("card declined"))
        stored = WorkflowStep.objects.get(pk=step.pk)
        assert stored.status == "failed" and stored.error["message"] == "card declined"
        row = WorkflowStepAttempt.objects.get(step=step, attempt=1)
        assert row.status == "failed" and row.failed_at is not None and row.succeeded_at is None
        assert WorkflowStep.objects.claim_attempt(run.pk, "charge", "shop.charge", LEASE) == 2
        assert WorkflowStep.objects.get(pk=step.pk).error is None
        with pytest.raises(ValueError, match="result"):
            WorkflowStep.objects.finish_attempt(step.pk, 2, result=object())
        assert WorkflowStep.objects.get(pk=step.pk).status == "running"


def sql_now() -> Any:
    from pikku_django.clock import DbNowMs

    return DbNowMs()


@skipUnless(connection.vendor == "postgresql", "prepared statements are a PostgreSQL matter")
class PreparedStatementTests(TransactionTestCase):
    def alias(self, name: str, **options: Any) -> str:
        """The default connection, reopened with ``options`` (every thread's connections read them)."""
        settings = connection.settings_dict["OPTIONS"]
        saved = dict(settings)

        def restore() -> None:
            connection.close()
            settings.clear()
            settings.update(saved)

        connection.close()
        settings.update(options)
        self.addCleanup(restore)
        return "default"

    def prepared(self, alias: str) -> list[str]:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall()]

    def drive(self, alias: str) -> None:
        run = WorkflowRun.objects.db_manager(alias).create_run("test.noop", {"steps": 3})
        from pikku_django.workflows import run_workflow

        assert run_workflow(run.pk, using=alias).status == "completed"

    def test_default_settings_prepare_the_hot_statements(self) -> None:
        alias = self.alias("plain")
        self.drive(alias)
        prepared = self.prepared(alias)
        assert any("INSERT INTO" in text and "pikku_workflow_step" in text for text in prepared), prepared
        assert any('"pikku_lease"' in text for text in prepared)
        assert any('UPDATE "pikku_workflow_run" SET "status"' in text for text in prepared), prepared
        # Django's own statements (their columns named "table"."column") stay
        # unprepared: its cursors keep prepare_threshold=None.
        assert not any('"pikku_workflow_run"."' in text for text in prepared), prepared
        assert connections[alias].connection.prepare_threshold is None

    def test_prepare_threshold_none_in_options_turns_it_off(self) -> None:
        alias = self.alias("unprepared", prepare_threshold=None)
        self.drive(alias)
        assert self.prepared(alias) == []

    def test_statements_a_pooler_dropped_run_again_unprepared(self) -> None:
        alias = self.alias("pooled")
        self.drive(alias)
        assert self.prepared(alias)
        # What a transaction-mode pooler does to a session's prepared
        # statements when it hands the client another server session.
        with connections[alias].cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        self.drive(alias)
        # The hot statements went unprepared from then on, and nothing failed.
        assert self.prepared(alias) == []
        assert connections[alias].connection._pikku_unprepared is True

    def test_server_side_binding(self) -> None:
        alias = self.alias("ssb", server_side_binding=True)
        self.drive(alias)
        steps = WorkflowStep.objects.db_manager(alias)
        run = WorkflowRun.objects.db_manager(alias).create_run("order")
        step = steps.start_step(run.pk, "charge", "shop.charge", LEASE, {"x": [1]}, retries=1, retry_delay=5)
        assert step is not None
        steps.finish_attempt(step.pk, 1, error=RuntimeError("no"))
        assert steps.claim_attempt(run.pk, "charge", "shop.charge", LEASE) == 2
        assert steps.finish_attempt(step.pk, 2, result=None) is None
        assert steps.get(pk=step.pk).status == "succeeded"


@skipUnless(connection.vendor == "mysql", "multi-statements are a mysqlclient option")
class MultiStatementsOffTests(TransactionTestCase):
    def test_the_same_transactions_a_statement_at_a_time(self) -> None:
        settings = connection.settings_dict["OPTIONS"]
        saved = dict(settings)

        def restore() -> None:
            connection.close()
            settings.clear()
            settings.update(saved)

        connection.close()
        settings["multi_statements"] = False
        self.addCleanup(restore)
        counts = {}
        for steps in (0, 3):
            run = start_workflow("test.noop", {"steps": steps})
            counts[steps] = drive_counted(run.pk)
        # The first start: START TRANSACTION, two writes, COMMIT; each later
        # one: START TRANSACTION, LAST_INSERT_ID reset, the outcome before it
        # and the start with their history rows, COMMIT; the last outcome
        # (the reset and two writes) rides in the run's outcome's transaction.
        assert counts[3].statements - counts[0].statements == 4 + 2 * 7 + 3
        assert counts[3].commits - counts[0].commits == 3
        run = make_run()
        step = WorkflowStep.objects.start_step(run.pk, "charge", "shop.charge", LEASE)
        assert step is not None
        assert WorkflowStep.objects.claim_attempt(run.pk, "charge", "shop.charge", LEASE) is None
        lapse_step(step)
        assert WorkflowStep.objects.claim(run.pk, "charge", "shop.charge", LEASE).attempt == 2
        with pytest.raises(StepSupersededError):
            WorkflowStep.objects.finish_attempt(step.pk, 1, result=1)
        assert WorkflowStep.objects.finish_attempt(step.pk, 2, result=2) == 2
        statuses = dict(WorkflowStepAttempt.objects.filter(step=step).values_list("attempt", "status"))
        assert statuses == {1: "running", 2: "succeeded"}


class KeeperTests(TransactionTestCase):
    def step(self, lease_ms: int) -> WorkflowStep:
        step = WorkflowStep.objects.start_step(make_run().pk, "charge", "shop.charge", lease_ms)
        assert step is not None
        return step

    def test_renews_every_third_of_the_lease(self) -> None:
        step = self.step(300)
        first = WorkflowStep.objects.get(pk=step.pk).lease_expires_at
        renewal = StepLeaseRenewal(step, 300, "default")
        renewal.start()
        try:
            poll_until(lambda: WorkflowStep.objects.get(pk=step.pk).lease_expires_at > first, timeout=10)
            assert not renewal.lost.is_set()
            # One renewal thread for the whole process, not one per step.
            assert [t.name for t in threading.enumerate()].count("pikku-keeper") == 1
            assert not any(t.name.startswith("pikku-renewal:step") for t in threading.enumerate())
        finally:
            renewal.stop()

    def test_a_superseded_step_is_lost_at_once_and_a_failing_renewal_proves_nothing(self) -> None:
        step = self.step(3_000)
        other = self.step(300)
        failures = threading.Event()
        real = WorkflowStepManager.refresh_lease

        def flaky(self: WorkflowStepManager, step_id: Any, lease_ms: Any, attempt: Any = None) -> bool:
            if step_id == other.pk and not failures.is_set():
                failures.set()
                raise OperationalError("database unreachable")
            return real(self, step_id, lease_ms, attempt)

        with mock.patch.object(WorkflowStepManager, "refresh_lease", flaky):
            kept = StepLeaseRenewal(step, 3_000, "default")
            flaky_one = StepLeaseRenewal(other, 300, "default")
            kept.start()
            flaky_one.start()
            try:
                assert failures.wait(timeout=10)
                lapse_step(step)
                WorkflowStep.objects.claim_attempt(step.run_id, "charge", "shop.charge", LEASE)
                assert kept.lost.wait(timeout=10)
                first = WorkflowStep.objects.get(pk=other.pk).lease_expires_at
                poll_until(lambda: WorkflowStep.objects.get(pk=other.pk).lease_expires_at > first, timeout=10)
                assert not flaky_one.lost.is_set()
            finally:
                kept.stop()
                flaky_one.stop()


class WorkerConnectionTests(TransactionTestCase):
    def test_keeps_a_healthy_connection_whatever_conn_max_age(self) -> None:
        assert connection.settings_dict["CONN_MAX_AGE"] == 0
        connection.ensure_connection()
        raw = connection.connection
        refresh_connections()
        assert connection.connection is raw

    @skipIf(connection.vendor == "sqlite", "a SQLite connection is a file handle, not a socket to drop")
    def test_drops_a_broken_one(self) -> None:
        connection.ensure_connection()
        connection.connection.close()
        with pytest.raises(Exception), connection.cursor() as cursor:  # noqa: B017
            cursor.execute("SELECT 1")
        assert connection.errors_occurred or connection.connection is None
        refresh_connections()
        assert connection.connection is None
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
