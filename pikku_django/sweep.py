"""
One sweep pass: fail steps that lost their worker on their last attempt, time
out runs past their deadline, wake runs that need a worker (never one due
later, unless its worker was lost in a step; suspended runs whose signal is
waiting too), prune dead lease rows, prune finished runs past their
retention, and prune the per-minute rollup's rows past a day. Every write
is a guarded statement, so sweeps on many nodes at once do no double work
and no harm.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
import time
import uuid
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.conf import conf
from pikku_django.managers import FINISHED_RUN_STATUSES, SPENT
from pikku_django.managers.base import write_alias
from pikku_django.models import (
    Lease,
    LeaseTokenFloor,
    WorkflowRun,
    WorkflowSignal,
    WorkflowStep,
    WorkflowStepAttempt,
)
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import take_write_lock
from pikku_django.store import prune, rollup
from pikku_django.store.lifecycle import time_out_runs

logger = logging.getLogger(__name__)

#: How long a raised token floor stands before rows under it may be deleted:
#: far longer than any acquire statement takes between reading the floor and
#: writing its row.
PRUNE_GRACE_MS = 30_000

RUN_LEASE_PREFIX = "workflow-run:"


@dataclasses.dataclass
class SweepReport:
    """What one pass found and did (with ``dry_run``, what it would have done)."""

    dry_run: bool = False
    failed_steps: int = 0
    timed_out_runs: int = 0
    lapsed_runs: int = 0
    stalled_runs: int = 0
    undispatched_runs: int = 0
    woken_runs: int = 0
    backed_off_runs: int = 0
    signalled_runs: int = 0
    pruned_leases: int = 0
    pruned_runs: int = 0
    pruned_minutes: int = 0
    duration_ms: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        verb = "would" if self.dry_run else "did"
        return (
            f"Sweep ({verb}): failed {self.failed_steps} spent steps; "
            f"timed out {self.timed_out_runs} runs past their deadline; woke {self.woken_runs} runs "
            f"({self.lapsed_runs} with a lapsed step, {self.stalled_runs} stalled, "
            f"{self.undispatched_runs} with undispatched steps; {self.backed_off_runs} left in back-off); "
            f"woke {self.signalled_runs} suspended runs whose signal was waiting; "
            f"pruned {self.pruned_leases} leases, {self.pruned_minutes} rollup minutes "
            f"and {self.pruned_runs} finished runs; {self.duration_ms} ms."
        )


def sweep(
    *,
    stalled_after_ms: int | None = None,
    limit: int = 100,
    prune_limit: int = 1000,
    dry_run: bool = False,
    using: str | None = None,
    prune: bool = True,
) -> SweepReport:
    """
    One pass over the store; see the module docstring. Each unit returns its
    own counts and the report adds them up. ``prune=False`` leaves out the
    prunes (leases, runs, and the rollup's minutes past a day).
    """
    idle_ms = (
        conf.STALLED_AFTER_MS
        if stalled_after_ms is None
        else validate.whole("stalled_after_ms", stalled_after_ms, maximum=validate.MAX_TTL_MS)
    )
    validate.whole("limit", limit, minimum=1, maximum=validate.MAX_INTEGER)
    validate.whole("prune_limit", prune_limit, minimum=1, maximum=validate.MAX_INTEGER)
    alias = write_alias(WorkflowRun, using)
    started = time.monotonic()
    report = SweepReport(dry_run=dry_run)
    report.failed_steps = fail_spent_steps(limit, dry_run, alias)
    report.timed_out_runs = time_out_late_runs(limit, dry_run, alias)
    woken = wake_idle_runs(idle_ms, limit, dry_run, alias)
    report.lapsed_runs = woken.lapsed_runs
    report.stalled_runs = woken.stalled_runs
    report.undispatched_runs = woken.undispatched_runs
    report.woken_runs = woken.woken_runs
    report.backed_off_runs = woken.backed_off_runs
    report.signalled_runs = wake_signalled_runs(limit, dry_run, alias)
    if prune:
        report.pruned_leases = _prune_leases(limit, dry_run, alias)
        report.pruned_runs = prune_runs(prune_limit, dry_run=dry_run, using=alias)
        report.pruned_minutes = rollup.prune_minutes(prune_limit, dry_run, alias)
    report.duration_ms = int((time.monotonic() - started) * 1000)
    return report


@dataclasses.dataclass
class WokenRuns:
    """What :func:`wake_idle_runs` found and woke."""

    lapsed_runs: int = 0
    stalled_runs: int = 0
    undispatched_runs: int = 0
    woken_runs: int = 0
    backed_off_runs: int = 0


def wake_idle_runs(idle_ms: int, limit: int, dry_run: bool, alias: str) -> WokenRuns:
    """
    Runs that need a worker: a step whose worker was lost (woken at once,
    whatever the stalled window, so it is taken again promptly), stalled runs
    and runs with undispatched steps. Runs due later are waiting by design
    and are left alone.
    """
    runs = WorkflowRun.objects.db_manager(alias)
    steps = WorkflowStep.objects.db_manager(alias)
    lapsed_steps = steps.lapsed().filter(run__status="running")
    if dry_run:
        # A real pass has failed the spent ones by now (and woken their runs itself).
        lapsed_steps = lapsed_steps.exclude(SPENT)
    lapsed = set(lapsed_steps.values_list("run_id", flat=True)[:limit])
    if lapsed and not dry_run:
        _log_lost_workers(lapsed_steps, limit)
        _free_run_leases(lapsed, alias)
    # Stalled and undispatched runs that are due in the ordinary way are only
    # waiting for a free worker, and are left in their turn: waking them too
    # (wake_at 0) would put them level with the runs that lost their worker,
    # and a backlog older than the stalled window would hold every recovered
    # run back. Runs due later (run_after, a retry delay, a sleep...) are
    # waiting by design and are left alone too, however old their rows
    # (WorkflowRunQuerySet.due_later(), issue 20).
    stuck = runs.get_queryset().idle(idle_ms).not_queued()
    stalled = set(stuck.order_by("updated_at").values_list("pk", flat=True)[:limit])
    # Read from the runs neither queued nor due later (the not_queued ranges
    # of the (status, wake_at) index), each one's steps probed by its key:
    # a queued task's step is pending too, waiting its turn with its run, so
    # the pending steps of a backlog are no more the sweep's to read than
    # its runs.
    pending = steps.filter(
        run=OuterRef("pk"), status="pending", updated_at__lte=DbNow(minus_ms=conf.UNDISPATCHED_AFTER_MS)
    )
    waiting = runs.get_queryset().running().not_queued().filter(Exists(pending)).order_by()
    undispatched = set(waiting.values_list("pk", flat=True)[:limit])
    found = WokenRuns(len(lapsed), len(stalled), len(undispatched))
    due = lapsed | stalled | undispatched
    if due:
        candidates = runs.get_queryset().filter(pk__in=due)
        found.woken_runs = candidates.sweep_wakeable().count() if dry_run else candidates.sweep_wake()
        found.backed_off_runs = len(due) - found.woken_runs
    return found


def _log_lost_workers(lapsed_steps: QuerySet[WorkflowStep], limit: int) -> None:
    """Say, at WARNING, which step each lost worker left behind: it is about to be taken again."""
    holders = WorkflowStepAttempt.objects.filter(step=OuterRef("pk"), attempt=OuterRef("attempt"))
    rows = lapsed_steps.annotate(holder=Subquery(holders.values("holder")[:1]))
    for run_id, name, attempt, holder in rows.values_list("run_id", "step_name", "attempt", "holder")[:limit]:
        logger.warning(
            "Run %s: step %r lost its worker %s in attempt %s; its run is woken for another worker.",
            run_id,
            name,
            holder or "(unknown)",
            attempt,
        )


def _free_run_leases(run_ids: set[Any], alias: str) -> None:
    """
    A running step under a lapsed lease whose attempt was run by the holder
    of the run lease means the pass behind that lease is gone (its step lease
    and its run lease are renewed by the same keeper): lapse the run lease,
    guarded in the same statement by both, so a woken run is driven now, not
    once the dead worker's run lease runs out. A lapsed step left by an
    earlier, dead pass says nothing of the live pass that holds the run now,
    and its lease is left alone.
    """
    leases = Lease.objects.db_manager(alias)
    for run_id in run_ids:
        dead = WorkflowStep.objects.db_manager(alias).lapsed().filter(run_id=run_id)
        by_holder = WorkflowStepAttempt.objects.using(alias).filter(
            step__in=dead, attempt=F("step__attempt"), holder=OuterRef("holder")
        )
        leases.get_queryset().filter(key=f"{RUN_LEASE_PREFIX}{run_id}").filter(Exists(by_holder)).expire()


def wake_signalled_runs(limit: int, dry_run: bool, alias: str) -> int:
    """
    Suspended runs waiting for a signal that is stored and unconsumed: a wake
    that never came (its sender's wake was lost, or the signal was written
    some other way). Woken at once, ahead of the queue; returns how many.
    """
    return WorkflowSignal.objects.db_manager(alias).wake_signalled(limit, dry_run=dry_run)


def fail_spent_steps(limit: int, dry_run: bool, alias: str) -> int:
    """Steps whose worker vanished on their last attempt: failed, runs woken; returns how many."""
    spent = WorkflowStep.objects.db_manager(alias).lapsed().spent()[:limit]
    if dry_run:
        return spent.count()
    manager = WorkflowStep.objects.db_manager(alias)
    return sum(manager.fail_lost(step) for step in spent)


def time_out_late_runs(limit: int, dry_run: bool, alias: str) -> int:
    """
    Runs past their deadline, whatever they are doing (sleeping, waiting for a
    signal or a child, stalled, or running a step): failed with
    ``WorkflowTimeoutError``, children cancelled, running steps fenced out.
    Returns how many.
    """
    late = WorkflowRun.objects.db_manager(alias).get_queryset().timed_out()
    ids = list(late.order_by("deadline_at").values_list("pk", flat=True)[:limit])
    return len(ids) if dry_run else time_out_runs(alias, ids)


def _prune_leases(limit: int, dry_run: bool, alias: str) -> int:
    """
    Delete lapsed lease rows of finished runs, and rows lapsed for longer than
    PIKKU_LEASE_PRUNE_AFTER_MS, in two steps that keep tokens rising: first
    the token floor is raised above them (new keys start above it), and only
    a later sweep, once that floor has stood for PRUNE_GRACE_MS, deletes them.
    """
    leases = Lease.objects.db_manager(alias)
    now = leases.db_now_ms()
    cutoff = now - conf.LEASE_PRUNE_AFTER_MS
    # Both reads are bounded by ``limit`` and served by indexes (the key and
    # expires_at), so a pass costs the same however much history there is.
    old = dict(
        leases.filter(expires_at__lte=cutoff).order_by("expires_at").values_list("key", "token")[:limit]
    )
    run_leases = dict(
        leases.lapsed()
        .filter(key__startswith=RUN_LEASE_PREFIX, expires_at__gt=cutoff)
        .values_list("key", "token")[:limit]
    )
    finished = _finished_run_keys(run_leases, alias)
    # Guarded per kind: a key taken again since it was read no longer matches.
    candidates = Q(key__in=list(old), expires_at__lte=cutoff) | Q(key__in=finished, expires_at__lte=now)
    highest = max([*old.values(), *(run_leases[key] for key in finished)], default=None)

    if not old and not finished:
        # Nothing to prune and no floor to raise: an idle sweep writes nothing.
        return 0
    if dry_run:
        floor = LeaseTokenFloor.objects.using(alias).filter(pk=1).first() or LeaseTokenFloor()
        if floor.raised_at <= now - PRUNE_GRACE_MS:
            floor.prunable_token = floor.token
        return leases.filter(candidates, token__lte=floor.prunable_token).count()

    def write() -> int:
        take_write_lock(alias)
        floor, _ = LeaseTokenFloor.objects.using(alias).select_for_update().get_or_create(pk=1)
        stood = (floor.token, floor.prunable_token, floor.raised_at)
        if floor.raised_at <= now - PRUNE_GRACE_MS and floor.prunable_token < floor.token:
            floor.prunable_token = floor.token
        pruned, _ = leases.filter(candidates, token__lte=floor.prunable_token).delete()
        if highest is not None and highest > floor.token:
            floor.token = highest
            floor.raised_at = now
        if (floor.token, floor.prunable_token, floor.raised_at) != stood:
            floor.save()
        return pruned

    return in_transaction(alias, write)


def _finished_run_keys(run_leases: dict[str, int], alias: str) -> list[str]:
    """The run-lease keys whose run has finished (or is gone)."""
    ids = {}
    for key in run_leases:
        try:
            ids[uuid.UUID(key[len(RUN_LEASE_PREFIX) :])] = key
        except ValueError:
            continue
    alive = set(
        WorkflowRun.objects.using(alias)
        .filter(pk__in=ids)
        .exclude(status__in=FINISHED_RUN_STATUSES)
        .values_list("pk", flat=True)
    )
    return [key for run_id, key in ids.items() if run_id not in alive]


def prune_runs(limit: int = 1000, *, dry_run: bool = False, using: str | None = None) -> int:
    """
    Delete up to ``limit`` finished runs, oldest first, whose ``updated_at``
    (which a run's end sets) is older than PIKKU_RETENTION_MS for their
    status on the database clock, with their steps, attempts and signals;
    never a run with an unfinished run anywhere in its tree, each run on its
    own status's terms (``store.prune``). Returns how many runs
    it deleted (with ``dry_run``, would delete). Each status is one walk of
    the (status, updated_at) index, bounded by ``limit``, so a pass costs the
    same however much history is kept.
    """
    validate.whole("limit", limit, minimum=1)
    alias = write_alias(WorkflowRun, using)
    runs = WorkflowRun.objects.db_manager(alias)
    unfinished = runs.exclude(status__in=FINISHED_RUN_STATUSES)
    kept = runs.exclude(Exists(unfinished.filter(parent=OuterRef("pk")))).exclude(
        Exists(unfinished.filter(pk=OuterRef("parent_id")))
    )
    expired = {
        status: Q(status=status, updated_at__lte=DbNow(minus_ms=keep_ms))
        for status, keep_ms in conf.RETENTION_MS.items()
        if keep_ms is not None
    }
    oldest: list[tuple[Any, Any]] = []
    for guard in expired.values():
        walk = kept.filter(guard).order_by("updated_at").values_list("updated_at", "pk")
        oldest.extend(walk[:limit])
    picked = [pk for _, pk in sorted(oldest, key=lambda row: row[0])[:limit]]
    again = functools.reduce(operator.or_, expired.values(), Q(pk__in=[]))
    chosen = prune.whole_trees(runs.all(), picked, again, limit) if picked else set()
    if dry_run or not chosen:
        return len(chosen)

    def write() -> int:
        take_write_lock(alias)
        # Locked and judged again: a run retried (or a parent revived, a
        # child started) since it was read keeps its whole tree this pass.
        list(runs.filter(pk__in=chosen).select_for_update().values_list("pk", flat=True))
        if not prune.still_whole(runs.all(), chosen, again):
            return 0
        _, deleted = runs.filter(pk__in=chosen).delete()
        return deleted.get(WorkflowRun._meta.label, 0)

    return in_transaction(alias, write)


__all__ = ["PRUNE_GRACE_MS", "SweepReport", "prune_runs", "sweep", "wake_signalled_runs"]
