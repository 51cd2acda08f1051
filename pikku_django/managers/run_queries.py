"""
Selections of workflow runs (the filters of ``WorkflowRun.objects``): due,
due later, idle, wake, sweep-wake, cancel, timed out.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.db.models import Case, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, Value, When

from pikku_django import models as pikku_models
from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.managers.base import (
    ACTIVE_RUN_STATUSES,
    FINISHED_RUN_STATUSES,
    MIN_WAKE_AT,
    SWEEP_BACKOFF_MAX_MS,
    SWEEP_BACKOFF_MS,
    WOKEN,
    batched,
    write_alias,
)
from pikku_django.sql.cursors import make_way_for_writers
from pikku_django.wakeups import work_due

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun  # noqa: F401  (the QuerySet["WorkflowRun"] below)


class WorkflowRunQuerySet(models.QuerySet["WorkflowRun"]):
    def running(self) -> WorkflowRunQuerySet:
        return self.filter(status="running")

    def unfinished(self) -> WorkflowRunQuerySet:
        return self.exclude(status__in=FINISHED_RUN_STATUSES)

    def due(self) -> WorkflowRunQuerySet:
        """
        Running runs whose ``wake_at`` has come, on the database clock; and
        suspended ones whose wait timed out (a suspended run's ``wake_at`` is
        its wait's timeout, or NULL: only a signal wakes it).
        """
        return self.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lte=DbNowMs())

    def unpaused(self) -> WorkflowRunQuerySet:
        """Runs of queues not paused (``WorkflowQueue.paused``), by a subquery of the same statement."""
        queues = pikku_models.WorkflowQueue.objects.using(self.db)
        return self.exclude(queue__in=queues.filter(paused=True).values("name"))

    def next_due(self, limit: int) -> list[tuple[Any, int | None, str]]:
        """
        Up to ``limit`` of these runs that are due, as (id, wake_at, queue):
        highest priority first, then the earliest ``wake_at`` (``next_due_rows``).
        """
        return [(pk, wake_at, queue) for pk, wake_at, queue, _ in self.next_due_rows(limit)]

    def next_due_rows(self, limit: int) -> models.QuerySet[Any, Any]:
        """
        ``next_due(limit)`` as a query, not yet run, of (id, wake_at, queue,
        priority) rows (for a loop that compiles it once). One walk of
        the ``pikku_run_due_idx`` index per active status, each in the
        index's own order and stopping after ``limit`` rows, then the walks
        merged: an IN over the index's leading column would sort every due
        run on each look, and a backlog would make each look slower. Runs
        of a paused queue are left out by each walk (``unpaused``), after
        its key is read.
        """
        order = ("-priority", "wake_at")
        fields = ("pk", "wake_at", "queue", "priority")
        if connections[self.db].features.supports_slicing_ordering_in_compound:
            walks = [self._due_walk(status).unpaused().order_by(*order) for status in ACTIVE_RUN_STATUSES]
            first, *rest = (walk.values_list(*fields)[:limit] for walk in walks)
            return first.union(*rest, all=True).order_by(*order)[:limit]
        # SQLite allows no ORDER BY ... LIMIT inside a compound statement:
        # the walks pick ids as subqueries of one statement instead.
        picked = Q()
        for status in ACTIVE_RUN_STATUSES:
            walk = self._due_walk(status, bound_filters=True).unpaused().order_by(*order)
            picked |= Q(pk__in=walk.values("pk")[:limit])
        runs = self.model._default_manager.db_manager(self.db).get_queryset()
        return runs.filter(picked).order_by(*order).values_list(*fields)[:limit]

    def _due_walk(self, status: str, *, bound_filters: bool = False) -> WorkflowRunQuerySet:
        """
        The runs of ``status`` that are due, for a walk of ``pikku_run_due_idx``,
        where ``wake_at <= now`` is only a filter: keyed on ``status`` alone,
        a look with nothing due would read every run asleep until later. So
        the walk's key is the status of the earliest due run, read once (an
        uncorrelated subquery) from the front of the (status, wake_at) index,
        where the bound is a range: ``status``, or NULL when nothing is due,
        and a NULL key seeks nothing.

        ``bound_filters``: the walk's bound is written on ``wake_at + 0``,
        which no index can serve. SQLite's planner, offered the bound as a
        range of the (status, wake_at) index, takes that range and sorts
        every due run to find the first few: with a backlog of 10,000 tasks,
        3.7 ms a look instead of 0.1.
        """
        earliest = self.filter(status=status, wake_at__lte=DbNowMs()).order_by("wake_at")
        walk = self.filter(status=Subquery(earliest.values("status")[:1]))
        if bound_filters:
            woken = ExpressionWrapper(F("wake_at") + 0, output_field=models.BigIntegerField())
            return walk.alias(due_at=woken).filter(due_at__lte=DbNowMs())
        return walk.filter(wake_at__lte=DbNowMs())

    def due_later(self) -> WorkflowRunQuerySet:
        """
        Runs waiting by design: ``wake_at`` still ahead on the database clock
        and no step under a lapsed lease. The sweep never wakes them early
        and ``stalled()`` never lists them.

        Every wait a run is built to have sets ``wake_at`` to when it ends: a
        task's ``run_after``, a retry delay, a sleep, a wait's timeout, a
        schedule, a run held elsewhere. The one other writer of a future
        ``wake_at`` is a worker's take (now + ``PIKKU_LEASE_TTL_MS``), and if
        that pass dies the value lapses by itself, no later than the run lease
        the pass took right after it: waking the run sooner would only meet
        that lease.
        A worker lost in a step shows as the step's lapsed lease instead,
        whatever ``wake_at`` says; that is the one case the sweep brings a
        run due later forward (at once, freeing its run lease; issue 20).
        """
        return self.filter(wake_at__gt=DbNowMs()).exclude(self._has_lapsed_step())

    def not_due_later(self) -> WorkflowRunQuerySet:
        """The runs ``due_later()`` leaves out, in one WHERE clause a guarded UPDATE can carry."""
        return self.filter(Q(wake_at__isnull=True) | Q(wake_at__lte=DbNowMs()) | self._has_lapsed_step())

    def _has_lapsed_step(self) -> Exists:

        steps = pikku_models.WorkflowStep.objects.db_manager(self.db).get_queryset()
        return Exists(steps.lapsed().filter(run=OuterRef("pk")))

    def not_queued(self) -> WorkflowRunQuerySet:
        """
        Runs that are neither due later nor merely waiting their turn for a
        worker: ``wake_at`` unset, or woken out of turn (``WOKEN``, ahead of
        the queue). Both are ranges at the front of the (status, wake_at)
        index, so a sweep reads these and not the backlog of runs waiting
        their turn or due later. ``wake_at <= WOKEN`` is said as a range
        bounded on both sides: SQLite's planner, which prices a one-sided
        range like the one on ``updated_at``, would walk (status,
        updated_at) instead to spare a sort.
        """
        return self.filter(not_queued())

    def idle(self, idle_ms: int) -> WorkflowRunQuerySet:
        """
        Running runs with no step in flight, nothing touched for ``idle_ms``
        on the database clock, and not due later (``WorkflowRunManager.stalled()``
        lists them).
        """
        validate.whole("idle_ms", idle_ms, maximum=validate.MAX_TTL_MS)

        steps = (
            pikku_models.WorkflowStep.objects.db_manager(self.db).get_queryset().filter(run=OuterRef("pk"))
        )
        cutoff = DbNow(minus_ms=idle_ms)
        return (
            self.filter(status="running", updated_at__lte=cutoff)
            .not_due_later()
            .exclude(Exists(steps.in_flight()))
            .exclude(Exists(steps.filter(updated_at__gt=cutoff)))
        )

    def wake(self) -> int:
        """
        Make these running runs due now, ahead of the queue; returns how many.
        One guarded UPDATE per ``BULK_BATCH_RUNS`` of them, each its own
        transaction in autocommit, so waking a large selection never holds
        the write lock for long (and, on SQLite, with a pause between two for
        the writers waiting: ``make_way_for_writers``). The selection is read once, first (a list of
        ids, not a cursor left open beside the writes). For a run or two,
        ``wake_now()``.
        """
        alias = write_alias(self.model, self._db)  # type: ignore[attr-defined]
        ids = list(self.using(alias).running().order_by().values_list("pk", flat=True))
        runs = self.model._default_manager.db_manager(alias).get_queryset()
        woken, held = 0, 0.0
        for batch in batched(ids):
            make_way_for_writers(alias, held)
            started = time.monotonic()
            woken += runs.filter(pk__in=batch).wake_now()
            held = time.monotonic() - started
        return woken

    def wake_now(self) -> int:
        """Make these running runs due now, ahead of the queue, in one UPDATE; returns how many."""
        woken = self.running().update(wake_at=WOKEN)
        if woken:
            work_due(self.db or "default")
        return woken

    def sweep_wake(self) -> int:
        """
        Wake these running runs unless a sweep woke them lately or they are
        due later (see ``due_later()``): one guarded UPDATE, so sweeps on many
        nodes wake a run once, and a run that began a wait since the sweep
        read it keeps it. The back-off (30 s, doubling to 10 min) starts again
        once the run shows activity.
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
        woken = (
            self.running()
            .not_due_later()
            .filter(fresh | Q(sweep_after__lte=now))
            .update(
                sweep_after=now + backoff,
                sweep_wakes=Case(When(fresh, then=Value(1)), default=F("sweep_wakes") + 1),
                swept_at=DbNow(),
                wake_at=WOKEN,
            )
        )
        if woken:
            work_due(self.db or "default")
        return woken

    def sweep_wakeable(self) -> WorkflowRunQuerySet:
        """The runs ``sweep_wake()`` would wake now (for a dry run)."""
        fresh = Q(swept_at__isnull=True) | Q(updated_at__gt=F("swept_at"))
        return self.running().not_due_later().filter(fresh | Q(sweep_after__lte=DbNowMs()))

    def cancel(self) -> int:
        """
        Cancel these unfinished runs and their unfinished children, fencing
        out any step running for them; returns how many of these were
        cancelled. The selection is read once, then cancelled
        ``BULK_BATCH_RUNS`` runs to a transaction (``cancel_runs``): a run,
        its children and the parent step waiting on it always end together.
        """
        from pikku_django.store.lifecycle import cancel_runs

        alias = write_alias(self.model, self._db)  # type: ignore[attr-defined]
        return cancel_runs(
            alias, list(self.using(alias).unfinished().order_by().values_list("pk", flat=True))
        )

    def timed_out(self) -> WorkflowRunQuerySet:
        """
        Unfinished runs past their deadline on the database clock. The
        deadline is NOT NULL too, which the bound implies: PostgreSQL cannot
        price a bound on the clock (a subquery), and without it would take
        a third of the runs for past their deadline and scan the table; with
        it, it sees that most runs have none and reads the index range.
        """
        return self.filter(
            status__in=ACTIVE_RUN_STATUSES, deadline_at__isnull=False, deadline_at__lte=DbNowMs()
        )


def not_queued(prefix: str = "") -> Q:
    """``WorkflowRunQuerySet.not_queued()`` as a condition, on the run at ``prefix`` (``"run__"``)."""
    return Q(**{f"{prefix}wake_at__isnull": True}) | Q(**{f"{prefix}wake_at__range": (MIN_WAKE_AT, WOKEN)})
