"""
Raw-SQL managers. Each decision runs one guarded statement from ``sql.py`` on
the connection the manager is bound to (so ``db_manager(alias)`` and routers
are respected); everything that decides nothing is plain ORM.
"""

from __future__ import annotations

import datetime
import logging
import traceback
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When

from pikku_django import sql, validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    LeaseInTransactionError,
    StepFunctionMismatchError,
    StepLeaseExpiredError,
    StepSupersededError,
)

if TYPE_CHECKING:
    from pikku_django.models import Lease, WorkflowRun, WorkflowStep

logger = logging.getLogger(__name__)


def ensure_autocommit(connection: BaseDatabaseWrapper) -> None:
    """
    Refuse to run inside ``transaction.atomic()``: a lease written in an open
    transaction is invisible to other processes, and a rollback would hand its
    token out twice. The atomic blocks a Django ``TestCase`` wraps each test in
    are allowed, as ``atomic(durable=True)`` allows them.
    """
    if connection.in_atomic_block:
        if not getattr(connection.atomic_blocks[-1], "_from_testcase", False):
            raise LeaseInTransactionError(connection.alias)
    elif not connection.get_autocommit():
        raise LeaseInTransactionError(connection.alias)


class LeaseQuerySet(models.QuerySet["Lease"]):
    def live(self) -> LeaseQuerySet:
        """Leases whose holder still holds them, on the database clock."""
        return self.filter(expires_at__gt=DbNowMs())

    def lapsed(self) -> LeaseQuerySet:
        """Leases that have run out or been released."""
        return self.filter(expires_at__lte=DbNowMs())

    def expire(self) -> int:
        """Lapse these leases now, keeping their tokens; returns how many were live."""
        return self.live().update(expires_at=DbNowMs())


class LeaseManager(models.Manager["Lease"]):
    """Named leases on ``pikku_lease``, judged on the database's clock."""

    def get_queryset(self) -> LeaseQuerySet:
        return LeaseQuerySet(self.model, using=self._db)

    def live(self) -> LeaseQuerySet:
        return self.get_queryset().live()

    def lapsed(self) -> LeaseQuerySet:
        return self.get_queryset().lapsed()

    # -- the guarded operations ---------------------------------------------

    def _connection(self) -> BaseDatabaseWrapper:
        return connections[self.db if self._db else router.db_for_write(self.model)]

    def _lease(self, row: tuple[Any, ...], alias: str) -> Lease:
        return self.model.from_db(
            alias, ["key", "holder", "token", "expires_at"], [row[0], row[1], int(row[2]), int(row[3])]
        )

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        """
        Take ``key`` for ``holder`` for ``ttl_ms`` unless someone else holds it;
        never blocks. Returns the lease, or None while another holder has it.
        """
        params = {
            "key": validate.name("key", key),
            "holder": validate.name("holder", holder),
            "ttl_ms": validate.positive_ms("ttl_ms", ttl_ms),
        }
        return self._acquire(params)

    def _acquire(self, params: dict[str, Any], *, portable: bool = False) -> Lease | None:
        connection = self._connection()
        ensure_autocommit(connection)
        with connection.cursor() as cursor:
            # One statement; on MySQL 8, the upsert and its read-back (sql.MYSQL_LEASE_ACQUIRE).
            for text in sql.statements("lease_acquire", connection, portable=portable):
                cursor.execute(text, params)
            row = cursor.fetchone()
        if row is None or row[1] != params["holder"]:
            return None
        return self._lease(row, connection.alias)

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        """
        Extend ``lease`` to now + ``ttl_ms`` while it is still this holder's, of
        this token, and live. Returns the renewed lease, or None if it was lost.
        """
        params = {
            "key": lease.key,
            "holder": lease.holder,
            "token": lease.token,
            "ttl_ms": validate.positive_ms("ttl_ms", ttl_ms),
        }
        connection = self._connection()
        ensure_autocommit(connection)
        with connection.cursor() as cursor:
            cursor.execute(sql.statement("lease_refresh", connection), params)
            if connection.vendor == "mysql":
                # Rows matched (CLIENT.FOUND_ROWS); the expiry rides in LAST_INSERT_ID.
                if cursor.rowcount != 1:
                    return None
                row: tuple[Any, ...] | None = (lease.key, lease.holder, lease.token, cursor.lastrowid)
            else:
                row = cursor.fetchone()
        return None if row is None else self._lease(row, connection.alias)

    def release(self, lease: Lease) -> None:
        """Lapse ``lease`` if it is still this holder's and token's; the token stays."""
        connection = self._connection()
        ensure_autocommit(connection)
        with connection.cursor() as cursor:
            cursor.execute(
                sql.statement("lease_release", connection),
                {"key": lease.key, "holder": lease.holder, "token": lease.token},
            )

    def current(self, key: str) -> Lease | None:
        """The live lease on ``key``, or None."""
        validate.name("key", key)
        connection = self._connection()
        with connection.cursor() as cursor:
            cursor.execute(sql.statement("lease_current", connection), {"key": key})
            row = cursor.fetchone()
        return None if row is None else self._lease(row, connection.alias)

    def db_now_ms(self) -> int:
        """Now, in epoch ms, on the clock leases are judged by."""
        connection = self._connection()
        with connection.cursor() as cursor:
            cursor.execute(sql.statement("db_now", connection))
            (now,) = cursor.fetchone()
        return int(now)


# ---------------------------------------------------------------------------
# Workflow runs and steps
# ---------------------------------------------------------------------------

FINISHED_RUN_STATUSES = ("completed", "failed", "cancelled")

#: The ``wake_at`` of a run woken out of turn (by the admin, a sweep, or a step
#: that lost its worker): the epoch, so it is due at once *and* ahead of every
#: run that fell due in the ordinary way; a recovered run never waits behind a
#: backlog of fresh work.
WOKEN = 0

#: A step on its last allowed attempt (its worker-loss budget is spent).
SPENT = Q(attempt__gte=F("retries") + 1)

#: The sweep's back-off between two wakes of one idle run: 30 s, doubling to 10 min.
SWEEP_BACKOFF_MS = (30_000, 60_000, 120_000, 240_000, 480_000)
SWEEP_BACKOFF_MAX_MS = 600_000


def now_params(connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """The ``now_dt`` parameter SQLite's statements take (see ``sql._NOW_DT``)."""
    if connection.vendor != "sqlite":
        return {}
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"now_dt": connection.ops.adapt_datetimefield_value(now)}


def serialize_error(error: BaseException) -> dict[str, Any]:
    """An exception as the JSON stored on a failed step or run."""
    cls = type(error)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun"]):
    def running(self) -> WorkflowRunQuerySet:
        return self.filter(status="running")

    def unfinished(self) -> WorkflowRunQuerySet:
        return self.exclude(status__in=FINISHED_RUN_STATUSES)

    def due(self) -> WorkflowRunQuerySet:
        """Running runs whose ``wake_at`` has come, on the database clock."""
        return self.filter(status="running", wake_at__lte=DbNowMs())

    def wake(self) -> int:
        """Make these running runs due now, ahead of the queue; returns how many."""
        return self.running().update(wake_at=WOKEN)

    def sweep_wake(self) -> int:
        """
        Wake these running runs unless a sweep woke them lately: one guarded
        UPDATE, so sweeps on many nodes wake a run once. The back-off (30 s,
        doubling to 10 min) starts again once the run shows activity.
        """
        now = DbNowMs()
        fresh = Q(swept_at__isnull=True) | Q(updated_at__gt=F("swept_at"))
        backoff = Case(
            When(fresh, then=Value(SWEEP_BACKOFF_MS[0])),
            *(When(sweep_wakes=n, then=Value(ms)) for n, ms in enumerate(SWEEP_BACKOFF_MS) if n),
            default=Value(SWEEP_BACKOFF_MAX_MS),
        )
        # Assigned in this order: MySQL evaluates SET left to right, so each
        # expression reads only columns not assigned before it.
        return (
            self.running()
            .filter(fresh | Q(sweep_after__lte=now))
            .update(
                sweep_after=now + backoff,
                sweep_wakes=Case(When(fresh, then=Value(1)), default=F("sweep_wakes") + 1),
                swept_at=DbNow(),
                wake_at=WOKEN,
            )
        )

    def sweep_wakeable(self) -> WorkflowRunQuerySet:
        """The runs ``sweep_wake()`` would wake now (for a dry run)."""
        fresh = Q(swept_at__isnull=True) | Q(updated_at__gt=F("swept_at"))
        return self.running().filter(fresh | Q(sweep_after__lte=DbNowMs()))

    def cancel(self) -> int:
        """Cancel these unfinished runs; returns how many."""
        return self.unfinished().update(status="cancelled", wake_at=None, updated_at=DbNow())


class WorkflowRunManager(models.Manager["WorkflowRun"]):
    """The store of workflow runs."""

    def get_queryset(self) -> WorkflowRunQuerySet:
        return WorkflowRunQuerySet(self.model, using=self._db)

    def running(self) -> WorkflowRunQuerySet:
        return self.get_queryset().running()

    def due(self) -> WorkflowRunQuerySet:
        return self.get_queryset().due()

    def create_run(self, workflow: str, input: Any = None) -> WorkflowRun:
        """A new run of ``workflow``, running and due at once."""
        run = self.model(
            workflow=validate.name("workflow", workflow),
            input=validate.json_value("input", input),
            status="running",
            wake_at=DbNowMs(),
            created_at=DbNow(),
            updated_at=DbNow(),
        )
        run.save(force_insert=True, using=self.db)
        run.refresh_from_db(fields=["wake_at", "created_at", "updated_at"])
        return run

    def stalled(self, idle_ms: int, limit: int = 100) -> list[Any]:
        """
        Ids of running runs, oldest activity first, with no step in flight and
        nothing touched for ``idle_ms`` on the database clock. In flight means
        scheduled, suspended, or running under a live or NULL (parked) lease;
        a lapsed lease is a dead worker and is not in flight.
        """
        validate.whole("idle_ms", idle_ms)
        validate.whole("limit", limit, minimum=1)
        from pikku_django.models import WorkflowStep

        steps = WorkflowStep.objects.db_manager(self.db).get_queryset().filter(run=OuterRef("pk"))
        cutoff = DbNow(minus_ms=idle_ms)
        return list(
            self.get_queryset()
            .filter(status="running", updated_at__lte=cutoff)
            .exclude(Exists(steps.in_flight()))
            .exclude(Exists(steps.filter(updated_at__gt=cutoff)))
            .order_by("updated_at")
            .values_list("pk", flat=True)[:limit]
        )


class WorkflowStepQuerySet(models.QuerySet["WorkflowStep"]):
    def in_flight(self) -> WorkflowStepQuerySet:
        """Steps someone is (or is expected to be) working on."""
        return self.filter(
            Q(status__in=["scheduled", "suspended"])
            | Q(status="running", lease_expires_at__isnull=True)
            | Q(status="running", lease_expires_at__gt=DbNowMs())
        )

    def lapsed(self) -> WorkflowStepQuerySet:
        """Running steps whose worker's lease has run out."""
        return self.filter(status="running", lease_expires_at__lte=DbNowMs())

    def spent(self) -> WorkflowStepQuerySet:
        """Steps on their last allowed attempt."""
        return self.filter(SPENT)


class WorkflowStepManager(models.Manager["WorkflowStep"]):
    """The store of workflow steps: every transition is fenced to its attempt."""

    def get_queryset(self) -> WorkflowStepQuerySet:
        return WorkflowStepQuerySet(self.model, using=self._db)

    def in_flight(self) -> WorkflowStepQuerySet:
        return self.get_queryset().in_flight()

    def lapsed(self) -> WorkflowStepQuerySet:
        return self.get_queryset().lapsed()

    def _write_db(self) -> str:
        return self.db if self._db else router.db_for_write(self.model)

    def insert_step(
        self,
        run: WorkflowRun,
        step_name: str,
        rpc_name: str,
        data: Any = None,
        retries: int | None = None,
        retry_delay: int | None = None,
    ) -> WorkflowStep:
        """A new pending step of ``run`` (with its first attempt's history row)."""
        from pikku_django.models import WorkflowStepAttempt

        step = self.model(
            run=run,
            step_name=validate.name("step_name", step_name),
            rpc_name=validate.name("rpc_name", rpc_name),
            data=validate.json_value("data", data),
            retries=conf.STEP_RETRIES if retries is None else validate.whole("retries", retries),
            retry_delay=None if retry_delay is None else validate.whole("retry_delay", retry_delay),
            status="pending",
            attempt=1,
            created_at=DbNow(),
            updated_at=DbNow(),
        )
        alias = self._write_db()
        try:
            with transaction.atomic(using=alias):
                step.save(force_insert=True, using=alias)
                WorkflowStepAttempt.objects.using(alias).create(
                    step=step, attempt=1, status="pending", created_at=DbNow()
                )
        except IntegrityError as e:
            if self.using(alias).filter(run=run, step_name=step_name).exists():
                raise InvalidArgumentError(
                    f"step_name {step_name!r} is already a step of run {run.pk}; "
                    "a step name is used once per run."
                ) from e
            raise
        step.refresh_from_db(fields=["created_at", "updated_at"])
        return step

    def claim(self, run_id: Any, step_name: str, rpc_name: str, lease_ms: int) -> WorkflowStep | None:
        """
        Take the step to run it under a fresh lease of ``lease_ms``; None when
        it is not this caller's to run (done, held, parked, spent). A step
        whose worker vanished on its last attempt is failed here, and its run
        woken. A different ``rpc_name`` raises ``StepFunctionMismatchError``.
        """
        params = {
            "step_name": validate.name("step_name", step_name),
            "rpc_name": validate.name("rpc_name", rpc_name),
            "lease_ms": validate.positive_ms("lease_ms", lease_ms),
        }
        alias = self._write_db()
        connection = connections[alias]
        ensure_autocommit(connection)
        params["run_id"] = self.model._meta.get_field("run").get_db_prep_value(run_id, connection)
        params.update(now_params(connection))
        if connection.vendor == "postgresql":
            # One statement, atomic on its own: a transaction around it would
            # only add a BEGIN and a COMMIT round trip.
            step = self._claim(connection, params)
        else:
            with transaction.atomic(using=alias):
                step = self._claim(connection, params)
        if step is None:
            self._settle_unclaimed(run_id, step_name, rpc_name)
        return step

    def _claim(self, connection: BaseDatabaseWrapper, params: dict[str, Any]) -> WorkflowStep | None:
        alias = connection.alias
        text = sql.statement("step_claim", connection)
        if connection.vendor == "postgresql":
            # The UPDATE and the history row are one statement (sql.POSTGRESQL_STEP_CLAIM).
            rows = list(self.model.objects.raw(text, params).using(alias))
            return rows[0] if rows else None
        if connection.vendor == "sqlite":
            rows = list(self.model.objects.raw(text, params).using(alias))
            step = rows[0] if rows else None
        else:
            with connection.cursor() as cursor:
                cursor.execute(text, params)
                matched = cursor.rowcount
            step = (
                self.using(alias).get(run_id=params["run_id"], step_name=params["step_name"])
                if matched
                else None
            )
        if step is not None:
            with connection.cursor() as cursor:
                cursor.execute(
                    sql.statement("step_claim_history", connection),
                    {
                        "step_id": self.model._meta.get_field("id").get_db_prep_value(step.pk, connection),
                        "attempt": step.attempt,
                        **now_params(connection),
                    },
                )
        return step

    def _settle_unclaimed(self, run_id: Any, step_name: str, rpc_name: str) -> None:  # noqa: C901
        """
        Why did the claim match nothing? A mismatched function raises; a step
        whose worker vanished on its last attempt is failed (fencing that
        worker out) and its run woken; anything else is simply not ours.
        """
        alias = self._write_db()
        step = (
            self.using(alias).filter(run_id=run_id, step_name=step_name).annotate(db_now_ms=DbNowMs()).first()
        )
        if step is None:
            raise InvalidArgumentError(
                f"step_name {step_name!r} is not a step of run {run_id}; insert_step() it first."
            )
        if step.rpc_name != rpc_name:
            raise StepFunctionMismatchError(run_id, step_name, step.rpc_name, rpc_name)
        lapsed = (
            step.status == "running"
            and step.lease_expires_at is not None
            and step.lease_expires_at <= step.db_now_ms
        )
        if lapsed and step.is_exhausted:
            self.fail_lost(step)
        return None

    def fail_lost(self, step: WorkflowStep) -> bool:
        """
        Fail a step that lost its worker on every attempt, and wake its run.
        The write is guarded like a claim (still running, same attempt, lease
        still lapsed, budget spent): a worker that renewed meanwhile keeps the
        step. Moving it out of ``running`` fences that attempt out, so a last
        worker that was only slow can neither renew nor record over the failure.
        """
        from pikku_django.models import WorkflowRun

        alias = self._write_db()
        error = serialize_error(StepLeaseExpiredError(step.run_id, step.step_name, step.attempt))
        with transaction.atomic(using=alias):
            failed = (
                self.using(alias)
                .filter(
                    SPENT,
                    pk=step.pk,
                    status="running",
                    attempt=step.attempt,
                    lease_expires_at__lte=DbNowMs(),
                )
                .update(status="failed", error=error, result=None, lease_expires_at=None, updated_at=DbNow())
            )
            if not failed:
                return False
            _write_attempt(alias, step.pk, step.attempt, "failed", error=error, failed_at=DbNow())
            WorkflowRun.objects.db_manager(alias).get_queryset().filter(pk=step.run_id).wake()
        logger.warning("%s", error["message"])
        return True

    def refresh_lease(self, step_id: Any, lease_ms: int | None, attempt: int | None = None) -> bool:
        """
        Renew the step's lease to now + ``lease_ms`` (None parks it: running,
        never reclaimable, counted as in flight). False once another attempt
        owns the step, or it is no longer running.
        """
        if lease_ms is not None:
            validate.positive_ms("lease_ms", lease_ms)
        if attempt is not None:
            validate.whole("attempt", attempt, minimum=1)
        alias = self._write_db()
        ensure_autocommit(connections[alias])
        steps = self.using(alias).filter(pk=step_id, status="running")
        if attempt is not None:
            steps = steps.filter(attempt=attempt)
        expires = None if lease_ms is None else DbNowMs() + Value(lease_ms)
        return steps.update(lease_expires_at=expires, updated_at=DbNow()) == 1

    def record_result(self, step_id: Any, result: Any, attempt: int | None = None) -> None:
        """Record the step's success, fenced to ``attempt``."""
        validate.json_value("result", result)
        self._record(step_id, attempt, "succeeded", result=result, error=None)

    def record_error(self, step_id: Any, error: BaseException, attempt: int | None = None) -> None:
        """Record the attempt's failure, fenced to ``attempt``."""
        if not isinstance(error, BaseException):
            raise InvalidArgumentError(f"error must be an exception, not {type(error).__name__}.")
        self._record(step_id, attempt, "failed", result=None, error=serialize_error(error))

    def _record(self, step_id: Any, attempt: int | None, status: str, *, result: Any, error: Any) -> None:
        if attempt is not None:
            validate.whole("attempt", attempt, minimum=1)
        alias = self._write_db()
        stamp = {"succeeded_at" if status == "succeeded" else "failed_at": DbNow()}
        with transaction.atomic(using=alias):
            steps = self.using(alias).filter(pk=step_id, status="running")
            if attempt is not None:
                steps = steps.filter(attempt=attempt)
            written = steps.update(
                status=status, result=result, error=error, lease_expires_at=None, updated_at=DbNow()
            )
            if written != 1:
                # Nothing was written; raising leaves the transaction empty.
                raise StepSupersededError(step_id, attempt)
            if attempt is None:
                attempt = self.using(alias).values_list("attempt", flat=True).get(pk=step_id)
            _write_attempt(alias, step_id, attempt, status, result=result, error=error, **stamp)


def _write_attempt(alias: str, step_id: Any, attempt: int, status: str, **fields: Any) -> None:
    """Move an attempt's history row to ``status``, creating it if it is missing."""
    from pikku_django.models import WorkflowStepAttempt

    rows = WorkflowStepAttempt.objects.using(alias)
    if not rows.filter(step_id=step_id, attempt=attempt).update(status=status, **fields):
        rows.create(step_id=step_id, attempt=attempt, status=status, created_at=DbNow(), **fields)
