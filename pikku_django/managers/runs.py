"""The store of workflow runs: due, wake, sweep-wake, cancel, stalled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.managers.base import FINISHED_RUN_STATUSES, SWEEP_BACKOFF_MAX_MS, SWEEP_BACKOFF_MS, WOKEN

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun"]):
    def running(self) -> WorkflowRunQuerySet:
        return self.filter(status="running")

    def unfinished(self) -> WorkflowRunQuerySet:
        return self.exclude(status__in=FINISHED_RUN_STATUSES)

    def due(self) -> WorkflowRunQuerySet:
        """Running runs whose ``wake_at`` has come, on the database clock."""
        return self.filter(status="running", wake_at__lte=DbNowMs())

    def not_queued(self) -> WorkflowRunQuerySet:
        """
        Runs that are not merely waiting their turn for a worker: ``wake_at``
        unset or still ahead, or woken out of turn (``WOKEN``, ahead of the queue).
        """
        return self.filter(Q(wake_at__isnull=True) | Q(wake_at__gt=DbNowMs()) | Q(wake_at__lte=WOKEN))

    def idle(self, idle_ms: int) -> WorkflowRunQuerySet:
        """
        Running runs with no step in flight and nothing touched for ``idle_ms``
        on the database clock (``WorkflowRunManager.stalled()`` lists them).
        """
        validate.whole("idle_ms", idle_ms)
        from pikku_django.models import WorkflowStep

        steps = WorkflowStep.objects.db_manager(self.db).get_queryset().filter(run=OuterRef("pk"))
        cutoff = DbNow(minus_ms=idle_ms)
        return (
            self.filter(status="running", updated_at__lte=cutoff)
            .exclude(Exists(steps.in_flight()))
            .exclude(Exists(steps.filter(updated_at__gt=cutoff)))
        )

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

    def create_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        wake_at: int | None = None,
    ) -> WorkflowRun:
        """
        A new run of ``workflow`` on ``queue``, running and due at once (or at
        ``wake_at``, epoch ms judged on the database clock). It is one INSERT
        on the manager's connection, so inside ``transaction.atomic()`` it
        commits or rolls back with the caller's own writes.
        """
        if wake_at is not None:
            validate.whole("wake_at", wake_at)
        run = self.model(
            workflow=validate.name("workflow", workflow),
            input=validate.json_value("input", input),
            queue=validate.queue_name("queue", queue),
            priority=validate.priority("priority", priority),
            status="running",
            wake_at=DbNowMs() if wake_at is None else wake_at,
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
        validate.whole("limit", limit, minimum=1)
        return list(
            self.get_queryset().idle(idle_ms).order_by("updated_at").values_list("pk", flat=True)[:limit]
        )
