"""The store of signals: sent durably, each consumed by exactly one wait step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, router
from django.db.models import Exists, OuterRef, Q
from django.db.models.fields.json import KeyTextTransform

from pikku_django import models as pikku_models
from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import PARKED, WOKEN
from pikku_django.sql.conflicts import in_transaction
from pikku_django.wakeups import work_due

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun, WorkflowSignal, WorkflowStep

#: The ``rpc_name`` of a ``ctx.wait_for_signal`` step; its ``data["signal"]`` is the name.
SIGNAL_RPC = "pikku.wait_for_signal"

#: Run statuses a signal may still be sent to.
WAITING_RUN_STATUSES = ("running", "suspended")


class WorkflowSignalQuerySet(models.QuerySet["WorkflowSignal"]):
    def unconsumed(self) -> WorkflowSignalQuerySet:
        return self.filter(consumed_by__isnull=True)


class WorkflowSignalManager(models.Manager["WorkflowSignal"]):
    """Signals sent to runs."""

    def get_queryset(self) -> WorkflowSignalQuerySet:
        return WorkflowSignalQuerySet(self.model, using=self._db)

    def unconsumed(self) -> WorkflowSignalQuerySet:
        return self.get_queryset().unconsumed()

    def _write_db(self) -> str:
        return self.db if self._db else router.db_for_write(self.model)

    def send(
        self, run_id: Any, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> WorkflowSignal:
        """
        Store a signal for the run and wake the run if one of its steps waits
        for ``name``, in one transaction: both commit or neither does. An
        unknown or finished run is refused, naming ``run_id``. A second send
        with the run's ``idempotency_key`` stores nothing and returns the
        first signal.
        """

        validate.name("name", name)
        validate.json_value("payload", payload)
        if idempotency_key is not None:
            validate.name("idempotency_key", idempotency_key)
        alias = self._write_db()
        runs = pikku_models.WorkflowRun.objects.using(alias)
        try:
            status = runs.values_list("status", flat=True).get(pk=run_id)
        except (pikku_models.WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError):
            raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.") from None
        if status not in WAITING_RUN_STATUSES:
            raise InvalidArgumentError(
                f"run_id: workflow run {run_id} is {status}; a signal can only be sent to an unfinished run."
            )

        def write() -> WorkflowSignal:
            # Made afresh on each try: a try the server rolled back stored nothing.
            signal = self.model(
                run_id=run_id, name=name, payload=payload, sent_at=DbNowMs(), idempotency_key=idempotency_key
            )
            # The wake comes first: it takes the write lock on SQLite (no read
            # to upgrade from) and the run's row lock elsewhere, so two sends
            # racing with one key queue on the run instead of deadlocking
            # (on InnoDB each insert's foreign key check share-locks the run).
            if self._wake(alias, run_id, name):
                # Idle workers look again once this commits.
                work_due(alias)
            signal.save(force_insert=True, using=alias)
            return signal

        try:
            signal = in_transaction(alias, write)
        except IntegrityError:
            if idempotency_key is None:
                raise
            return self._sent_before(alias, run_id, name, idempotency_key)
        # A pass that suspends looks for signals after it writes its
        # suspension (waits.suspend_run), and this wake commits with the
        # signal, so one of the two always sees the other: no wake is lost.
        signal.refresh_from_db(using=alias, fields=["sent_at"])
        return signal

    def _wake(self, alias: str, run_id: Any, name: str) -> int:
        """Wake the run if one of its steps waits for ``name`` (one guarded UPDATE)."""

        waiting = pikku_models.WorkflowStep.objects.using(alias).filter(
            run=OuterRef("pk"), status="suspended", rpc_name=SIGNAL_RPC, data__signal=name
        )
        runs = pikku_models.WorkflowRun.objects.using(alias)
        return (
            runs.filter(pk=run_id, status__in=WAITING_RUN_STATUSES)
            .exclude(PARKED)
            .filter(Exists(waiting))
            .update(status="running", wake_at=WOKEN, updated_at=DbNow())
        )

    def _sent_before(self, alias: str, run_id: Any, name: str, idempotency_key: str) -> WorkflowSignal:
        """The signal an earlier send stored under the run's ``idempotency_key``."""
        signal = self.using(alias).get(run_id=run_id, idempotency_key=idempotency_key)
        if signal.name != name:
            raise InvalidArgumentError(
                f"idempotency_key {idempotency_key!r} already sent the signal {signal.name!r} "
                f"to run {run_id}, not {name!r}; use another key."
            )
        return signal

    def wake_signalled(self, limit: int, *, dry_run: bool = False) -> int:
        """
        Wake suspended runs that wait for a signal already stored and not
        consumed (a wake that never came): up to ``limit`` of them read, then
        one guarded UPDATE, still conditioned on each run being suspended with
        that signal waiting, so sweeps on many nodes wake a run once.
        Returns how many runs were woken (with ``dry_run``, would be).
        """

        alias = self._write_db()
        ids = list(self._signalled_runs(alias)[:limit])
        if not ids:
            return 0
        # The guard's subquery reads no run row: MySQL refuses a subquery on
        # the table an UPDATE writes; the outer filter checks the status.
        waiting = self._signalled(alias, of_suspended_runs=False).filter(run_id=OuterRef("pk"))
        runs = (
            pikku_models.WorkflowRun.objects.using(alias)
            .filter(pk__in=ids, status="suspended", error__isnull=True)
            .filter(Exists(waiting))
        )
        if dry_run:
            return runs.count()
        woken = runs.update(status="running", wake_at=WOKEN, updated_at=DbNow())
        if woken:
            work_due(alias)
        return woken

    def _signalled_runs(self, alias: str) -> models.QuerySet[Any, Any]:
        """
        The ids of suspended runs with a wait whose signal is stored and
        unconsumed, read from the signals not yet consumed (a range of the
        ``consumed_by`` index), each one's wait probed by its run's key: the
        steps of a backlog (a queued task's pending step, a sleeping run's)
        are never walked.
        """
        waits = self._signalled(alias).filter(Q(wanted=OuterRef("name")), run_id=OuterRef("run_id"))
        unconsumed = self.using(alias).filter(consumed_by__isnull=True).filter(Exists(waits))
        return unconsumed.order_by().values_list("run_id", flat=True).distinct()

    def _signalled(self, alias: str, *, of_suspended_runs: bool = True) -> models.QuerySet[WorkflowStep]:
        """Suspended signal waits whose signal is stored and unconsumed (of suspended runs)."""

        stored = self.using(alias).filter(
            run_id=OuterRef("run_id"), name=OuterRef("wanted"), consumed_by__isnull=True
        )
        waits = pikku_models.WorkflowStep.objects.using(alias).filter(status="suspended", rpc_name=SIGNAL_RPC)
        if of_suspended_runs:
            # A parked run (its error stored) is never woken: retry_workflow revives it.
            waits = waits.filter(run__status="suspended", run__error__isnull=True)
        return waits.annotate(wanted=KeyTextTransform("signal", "data")).filter(Exists(stored))

    def consumed_by_step(self, step: WorkflowStep) -> WorkflowSignal | None:
        """The signal this wait step consumed, if it did."""
        return self.using(self._write_db()).filter(consumed_by=step).first()

    def consume(self, step: WorkflowStep, name: str) -> WorkflowSignal | None:
        """
        Give the wait ``step`` the oldest signal ``name`` of its run that no
        wait consumed, exactly once: the guarded UPDATE (still unconsumed)
        decides, and a signal another wait took meanwhile is passed over for
        the next. The step's own unique ``consumed_by`` keeps it to one signal.
        """
        alias = self._write_db()
        signals = self.using(alias).filter(run_id=step.run_id, name=name)
        while True:
            already = self.consumed_by_step(step)
            if already is not None:
                return already
            candidate = (
                signals.filter(consumed_by__isnull=True)
                .order_by("sent_at", "id")
                .values_list("pk", flat=True)
                .first()
            )
            if candidate is None:
                return None
            taken = (
                signals.filter(consumed_by__isnull=True)
                .filter(pk=candidate)
                .update(consumed_by=step, consumed_at=DbNowMs())
            )
            if taken:
                return self.using(alias).get(pk=candidate)

    def waiting_for(self, run: WorkflowRun, name: str) -> bool:
        """Is a signal ``name`` of ``run`` waiting to be consumed?"""
        signals = self.using(self._write_db()).filter(run=run, name=name, consumed_by__isnull=True)
        return bool(signals.exists())
