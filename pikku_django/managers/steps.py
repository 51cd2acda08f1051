"""The store of workflow steps: every transition is fenced to its attempt."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, router
from django.db.models import F, Q, Value

from pikku_django import models as pikku_models
from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    StepLeaseExpiredError,
    StepSupersededError,
)
from pikku_django.managers.attempts import StepAttemptsMixin
from pikku_django.managers.base import SPENT, ensure_autocommit, serialize_error
from pikku_django.managers.claims import StepClaimsMixin
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import read_models

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun, WorkflowStep

logger = logging.getLogger(__name__)


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


class WorkflowStepManager(StepClaimsMixin, StepAttemptsMixin, models.Manager["WorkflowStep"]):
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
        *,
        worker_losses: int | None = None,
    ) -> WorkflowStep:
        """
        A new pending step of ``run`` (with its first attempt's history row).
        ``worker_losses`` gives it a worker-loss budget apart from its
        ``retries`` (as a Django task's step has; see ``WorkflowStep.is_exhausted``).
        """

        step = self.model(
            run=run,
            step_name=validate.name("step_name", step_name),
            rpc_name=validate.name("rpc_name", rpc_name),
            data=validate.json_value("data", data),
            retries=conf.STEP_RETRIES if retries is None else validate.retries("retries", retries),
            retry_delay=None if retry_delay is None else validate.retry_delay("retry_delay", retry_delay),
            worker_losses=None if worker_losses is None else validate.whole("worker_losses", worker_losses),
            status="pending",
            attempt=1,
            created_at=DbNow(),
            updated_at=DbNow(),
        )
        alias = self._write_db()

        def write() -> None:
            step.save(force_insert=True, using=alias)
            pikku_models.WorkflowStepAttempt.objects.using(alias).create(
                step=step, attempt=1, status="pending", created_at=DbNow()
            )

        try:
            in_transaction(alias, write)
        except IntegrityError as e:
            if self.using(alias).filter(run=run, step_name=step_name).exists():
                raise InvalidArgumentError(
                    f"step_name {step_name!r} is already a step of run {run.pk}; "
                    "a step name is used once per run."
                ) from e
            raise
        step.refresh_from_db(using=alias, fields=["created_at", "updated_at"])
        return step

    def insert_pending(
        self,
        run: WorkflowRun,
        step_name: str,
        rpc_name: str,
        *,
        retries: int,
        worker_losses: int | None = None,
        deferred: bool = False,
    ) -> None:
        """
        A new pending step of ``run`` in one INSERT, on the caller's
        connection and in its transaction if it has one: no history row (its
        first claim writes that) and nothing read back. A ``deferred`` step
        (its run due later) is ``scheduled``, in flight as a sleep is, so the
        sweep never takes its run for stalled or undispatched and wakes it
        early; a claim takes it as it takes a pending step.
        """
        self.model(
            run=run,
            step_name=validate.name("step_name", step_name),
            rpc_name=validate.name("rpc_name", rpc_name),
            retries=validate.retries("retries", retries),
            worker_losses=None if worker_losses is None else validate.retries("worker_losses", worker_losses),
            status="scheduled" if deferred else "pending",
            attempt=1,
            created_at=DbNow(),
            updated_at=DbNow(),
        ).save(force_insert=True, using=self._write_db())

    def of_run(self, run_id: Any) -> list[WorkflowStep]:
        """Every step of the run ``run_id``, in one prepared read (a pass's replay reads them so)."""
        alias = self.db
        run_id = self.model._meta.get_field("run").get_db_prep_value(run_id, connections[alias])
        return read_models(self.model, alias, "steps_of_run", {"run_id": run_id})

    def fail_lost(self, step: WorkflowStep) -> bool:
        """
        Fail a step that lost its worker on every attempt, and wake its run.
        The write is guarded like a claim (still running, same attempt, lease
        still lapsed, budget spent): a worker that renewed meanwhile keeps the
        step. Moving it out of ``running`` fences that attempt out, so a last
        worker that was only slow can neither renew nor record over the failure.
        """

        alias = self._write_db()
        error = serialize_error(StepLeaseExpiredError(step.run_id, step.step_name, step.attempt))

        def write() -> bool:
            failed = (
                self.using(alias)
                .filter(
                    SPENT,
                    pk=step.pk,
                    status="running",
                    attempt=step.attempt,
                    lease_expires_at__lte=DbNowMs(),
                )
                # The last loss counted too: a task's step is then over its
                # worker-loss budget, which no claim takes again (sql.steps).
                .update(
                    status="failed",
                    error=error,
                    result=None,
                    lease_expires_at=None,
                    losses=F("losses") + 1,
                    updated_at=DbNow(),
                )
            )
            if not failed:
                return False
            write_attempt(alias, step.pk, step.attempt, "failed", error=error, failed_at=DbNow())
            pikku_models.WorkflowRun.objects.db_manager(alias).get_queryset().filter(
                pk=step.run_id
            ).wake_now()
            return True

        if not in_transaction(alias, write):
            return False
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
            validate.whole("attempt", attempt, minimum=1, maximum=validate.MAX_INTEGER)
        alias = self._write_db()
        ensure_autocommit(connections[alias])
        steps = self.using(alias).filter(pk=step_id, status="running")
        if attempt is not None:
            steps = steps.filter(attempt=attempt)
        expires = None if lease_ms is None else DbNowMs() + Value(lease_ms)
        return steps.update(lease_expires_at=expires, updated_at=DbNow()) == 1

    def refresh_leases(self, attempts: Sequence[tuple[Any, int]], lease_ms: int) -> bool:
        """
        Renew the lease of every (step id, attempt) of ``attempts`` in one
        UPDATE, each guarded as ``refresh_lease`` is; True if every one was
        renewed (else ask each on its own to learn which was lost).
        """
        validate.positive_ms("lease_ms", lease_ms)
        alias = self._write_db()
        ensure_autocommit(connections[alias])
        mine = Q()
        for step_id, attempt in attempts:
            mine |= Q(pk=step_id, attempt=attempt)
        renewed = (
            self.using(alias)
            .filter(mine, status="running")
            .update(lease_expires_at=DbNowMs() + Value(lease_ms), updated_at=DbNow())
        )
        return renewed == len(attempts)

    def record_result(self, step_id: Any, result: Any, attempt: int | None = None) -> None:
        """Record the step's success, fenced to ``attempt``."""
        if attempt is not None:
            self.finish_attempt(step_id, attempt, result=result)
            return
        validate.json_value("result", result)
        self._record(step_id, attempt, "succeeded", result=result, error=None)

    def record_error(self, step_id: Any, error: BaseException, attempt: int | None = None) -> None:
        """Record the attempt's failure, fenced to ``attempt``."""
        if not isinstance(error, BaseException):
            raise InvalidArgumentError(f"error must be an exception, not {type(error).__name__}.")
        if attempt is not None:
            self.finish_attempt(step_id, attempt, error=error)
            return
        self._record(step_id, attempt, "failed", result=None, error=serialize_error(error))

    def _record(self, step_id: Any, attempt: int | None, status: str, *, result: Any, error: Any) -> None:
        if attempt is not None:
            validate.whole("attempt", attempt, minimum=1, maximum=validate.MAX_INTEGER)
        alias = self._write_db()
        stamp = {"succeeded_at" if status == "succeeded" else "failed_at": DbNow()}

        def write() -> None:
            steps = self.using(alias).filter(pk=step_id, status="running")
            if attempt is not None:
                steps = steps.filter(attempt=attempt)
            written = steps.update(
                status=status, result=result, error=error, lease_expires_at=None, updated_at=DbNow()
            )
            if written != 1:
                # Nothing was written; raising leaves the transaction empty.
                raise StepSupersededError(step_id, attempt)
            number = attempt
            if number is None:
                number = self.using(alias).values_list("attempt", flat=True).get(pk=step_id)
            write_attempt(alias, step_id, number, status, result=result, error=error, **stamp)

        in_transaction(alias, write)


def write_attempt(alias: str, step_id: Any, attempt: int, status: str, **fields: Any) -> None:
    """Move an attempt's history row to ``status``, creating it if it is missing."""

    rows = pikku_models.WorkflowStepAttempt.objects.using(alias)
    if not rows.filter(step_id=step_id, attempt=attempt).update(status=status, **fields):
        rows.create(step_id=step_id, attempt=attempt, status=status, created_at=DbNow(), **fields)
