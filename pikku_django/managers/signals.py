"""The store of signals: sent durably, each consumed by exactly one wait step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import models, router
from django.db.models import Exists, OuterRef

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import WOKEN

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

    def send(self, run_id: Any, name: str, payload: Any = None) -> WorkflowSignal:
        """
        Store a signal for the run and wake the run if one of its steps waits
        for ``name``. An unknown or finished run is refused, naming ``run_id``.
        """
        from pikku_django.models import WorkflowRun, WorkflowStep

        validate.name("name", name)
        validate.json_value("payload", payload)
        alias = self._write_db()
        runs = WorkflowRun.objects.using(alias)
        try:
            status = runs.values_list("status", flat=True).get(pk=run_id)
        except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError):
            raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.") from None
        if status not in WAITING_RUN_STATUSES:
            raise InvalidArgumentError(
                f"run_id: workflow run {run_id} is {status}; a signal can only be sent to an unfinished run."
            )
        signal = self.model(run_id=run_id, name=name, payload=payload, sent_at=DbNowMs())
        signal.save(force_insert=True, using=alias)
        signal.refresh_from_db(using=signal._state.db, fields=["sent_at"])
        # The signal is committed before this wake, and a pass that suspends
        # looks for signals after it writes its suspension (waits.suspend_run),
        # so one of the two always sees the other: no wake is lost.
        waiting = WorkflowStep.objects.using(alias).filter(
            run=OuterRef("pk"), status="suspended", rpc_name=SIGNAL_RPC, data__signal=name
        )
        runs.filter(pk=run_id, status__in=WAITING_RUN_STATUSES).filter(Exists(waiting)).update(
            status="running", wake_at=WOKEN, updated_at=DbNow()
        )
        return signal

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
