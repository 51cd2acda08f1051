"""
How a run ends besides finishing its function: cancelled, or timed out at its
deadline; and how a child's end reaches the parent step parked on it.

Every write here is guarded by the state it moves from (a run still
unfinished, a step still running or waiting), so a racing pass, a second
cancel or a second sweep changes nothing that was already decided.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Q

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.errors import WorkflowCancelledError, WorkflowTimeoutError
from pikku_django.managers.base import (
    ACTIVE_RUN_STATUSES,
    BULK_BATCH_RUNS,
    FINISHED_RUN_STATUSES,
    PARKED,
    WOKEN,
    batched,
    serialize_error,
)
from pikku_django.managers.fence import UNFENCED, RunFence
from pikku_django.managers.steps import write_attempt
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import (
    hot_cursor,
    make_way_for_writers,
    model_from_row,
    now_params,
    take_write_lock,
)
from pikku_django.sql.drivers import driver
from pikku_django.sql.runs import RUN_OUTCOMES
from pikku_django.store import rollup
from pikku_django.store.fanout import item_ended
from pikku_django.wakeups import work_due

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from pikku_django.models import WorkflowRun

#: Step statuses that an ended run's steps are fenced out of: a running step
#: (leased or parked on a child) and a sleep or wait in progress. Moving them
#: to ``failed`` makes a renewal answer "not yours" and a late result change
#: nothing (both are guarded by ``status = 'running'`` and the attempt).
FENCED_STEP_STATUSES = ("running", "scheduled", "suspended")


#: ``parent_id`` not known to the caller: read it.
UNKNOWN = object()


def finish_run(
    alias: str,
    run_id: Any,
    status: str,
    *,
    parent_id: Any = UNKNOWN,
    fence: RunFence | None = None,
    into: WorkflowRun | None = None,
    **fields: Any,
) -> bool:
    """
    Record the outcome of a run that is still active (running, or suspended:
    a wake may have raced the pass) and, in the same transaction, hand it to
    the parent step parked on it (if any). Given the pass's ``fence``, only
    while its run lease holds. A caller that knows the run's ``parent_id``
    (None for a top-level run) saves a read. ``into``: the pass's instance
    of the run, given the end stored (``stored_end``) where the statement
    returns it.
    """

    # A top-level run: no parent to lock or hand the outcome to, so the
    # outcome is one statement in autocommit, not a transaction around it.
    name = None if parent_id is not None else RUN_OUTCOMES.get(tuple(sorted(fields)))
    if name is not None:
        return _finish_top_level(alias, name, run_id, status, fence, fields, into)
    finished = WorkflowRun.objects.using(alias).filter(pk=run_id, status__in=ACTIVE_RUN_STATUSES)
    if fence is not None:
        finished = finished.filter(fence.held(alias))
    if parent_id is None:
        return bool(finished.update(status=status, wake_at=None, updated_at=DbNow(), **fields))

    def write() -> int:
        take_write_lock(alias)
        _lock_parent(alias, run_id, parent_id)
        done = finished.update(status=status, wake_at=None, updated_at=DbNow(), **fields)
        if done and parent_id is not None:
            settle_parent_step(alias, run_id)
        return done

    return bool(in_transaction(alias, write))


def _finish_top_level(
    alias: str,
    name: str,
    run_id: Any,
    status: str,
    fence: RunFence | None,
    fields: dict[str, Any],
    into: WorkflowRun | None,
) -> bool:
    """
    ``finish_run``'s UPDATE of a top-level run's outcome, as one prepared
    statement (``sql.runs._RUN_FINISH``): the ORM's would be built anew for
    every run, which costs more than running it.
    """
    connection = connections[alias]
    params = outcome_params(connection, run_id, status, fence, fields)
    with hot_cursor(connection) as cursor:
        ended = driver(connection).end_run(connection, cursor, name, params)
    if ended is None:
        return False
    stamp_end(into, alias, *ended)
    return True


def outcome_params(
    connection: BaseDatabaseWrapper, run_id: Any, status: str, fence: RunFence | None, fields: dict[str, Any]
) -> dict[str, Any]:
    """The parameters of a top-level run's outcome statement (``sql.runs._RUN_FINISH``)."""

    params: dict[str, Any] = {
        "run_id": WorkflowRun._meta.pk.get_db_prep_value(run_id, connection),
        "status": status,
        **(UNFENCED if fence is None else fence.params()),
        **now_params(connection),
    }
    for column, value in fields.items():
        # The JSON text the field stores (a JSON null is SQL NULL, as the ORM saves None).
        params[column] = None if value is None else json.dumps(value)
    return params


def stamp_end(into: WorkflowRun | None, alias: str, description: Any, row: tuple[Any, ...]) -> None:
    """Give ``into`` the end its outcome's statement stored and returned (``updated_at``, ``stored_end``)."""

    if into is not None:
        # Converted as the ORM converts it (a naive datetime under USE_TZ = False, say).
        into.updated_at = model_from_row(WorkflowRun, alias, description, row).updated_at
        into.__dict__[_STORED_END] = into.updated_at


#: Where ``finish_run`` leaves the end it stored on the pass's instance of the run.
_STORED_END = "_pikku_stored_end"


def stored_end(run: WorkflowRun) -> Any:
    """The end (``updated_at``) ``finish_run`` stored for ``run`` and got back, or None."""
    return run.__dict__.get(_STORED_END)


def settle_parent_step(alias: str, child_id: Any) -> None:
    """
    The child ``child_id`` has ended: record its output as the parked parent
    step's result (or its error as the step's failure) and wake the parent;
    or, for an item of a fan-out, count its end (``managers.fanout``).
    """

    child = (
        WorkflowRun.objects.using(alias)
        .filter(pk=child_id)
        .values("status", "output", "error", "parent_id", "parent_step_id")
        .first()
    )
    if child is None or child["status"] not in FINISHED_RUN_STATUSES:
        return
    if child["parent_step_id"] is not None:
        # An item of a ctx.map or ctx.workflows step: counted, not settled alone.

        item_ended(alias, child_id, child["parent_id"], child["parent_step_id"], child["status"])
        return
    parked = WorkflowStep.objects.using(alias).filter(
        child_run_id=child_id, status="running", lease_expires_at__isnull=True
    )
    rows = list(parked.select_for_update().values_list("pk", "run_id", "attempt"))
    if not rows:
        return
    if child["status"] == "completed":
        fields: dict[str, Any] = {"status": "succeeded", "result": child["output"], "error": None}
        stamp = {"succeeded_at": DbNow()}
    else:
        error = child["error"] or serialize_error(WorkflowCancelledError(child_id))
        fields = {"status": "failed", "result": None, "error": {**error, "child_run": str(child_id)}}
        stamp = {"failed_at": DbNow()}
    parked.filter(pk__in=[pk for pk, _, _ in rows]).update(
        lease_expires_at=None, updated_at=DbNow(), **fields
    )
    for step_id, _, attempt in rows:
        write_attempt(
            alias, step_id, attempt, fields["status"], result=fields["result"], error=fields["error"], **stamp
        )
    woken = (
        WorkflowRun.objects.using(alias)
        .filter(pk__in={run_id for _, run_id, _ in rows}, status__in=ACTIVE_RUN_STATUSES)
        .exclude(PARKED)
        .update(status="running", wake_at=WOKEN, updated_at=DbNow())
    )
    if woken:
        work_due(alias)


def cancel_runs(alias: str, run_ids: Iterable[Any], *, batch_size: int = BULK_BATCH_RUNS) -> int:
    """
    Cancel the unfinished runs of ``run_ids`` and their unfinished children,
    ``batch_size`` runs to a transaction (see ``end_runs``), so other writers
    get in between two batches however many runs there are (on SQLite, in a
    pause made for them: ``make_way_for_writers``). Returns how many
    of ``run_ids`` this call cancelled: directly, or as a child of one
    cancelled in an earlier batch.
    """
    validate.whole("batch_size", batch_size, minimum=1, maximum=validate.MAX_INTEGER)
    cancelled = 0
    descendants: set[Any] = set()
    held = 0.0
    for batch in batched(run_ids, batch_size):
        make_way_for_writers(alias, held)
        started = time.monotonic()
        ended, children = _end_batch(
            alias, batch, status="cancelled", error=lambda run_id: WorkflowCancelledError(run_id)
        )
        held = time.monotonic() - started
        cancelled += len(ended) + sum(1 for run_id in batch if run_id in descendants)
        descendants |= children
    return cancelled


def time_out_runs(alias: str, run_ids: Iterable[Any]) -> int:
    """
    Fail the runs of ``run_ids`` past their deadline (and cancel their
    children), in one transaction: the sweep passes a bounded number, and
    each run it names fails with its own timeout, not cancelled as another's
    child. Returns how many.
    """
    return len(
        end_runs(
            alias,
            run_ids,
            status="failed",
            error=lambda run_id: WorkflowTimeoutError(run_id),
            guard=Q(deadline_at__lte=DbNowMs()),
        )
    )


def end_runs(
    alias: str,
    run_ids: Iterable[Any],
    *,
    status: str,
    error: Any,
    guard: Q | None = None,
) -> list[Any]:
    """
    End each unfinished run of ``run_ids`` with ``status`` and ``error(run_id)``,
    in one transaction: fence its running, sleeping and waiting steps, cancel
    its unfinished descendants likewise, settle the parent step of each
    run ended, and add the failed ones to the per-minute rollup
    (``rollup.add_runs_within``). Returns the ids of the runs it ended.
    """
    ended, _ = _end_batch(alias, list(run_ids), status=status, error=error, guard=guard)
    return ended


def _end_batch(
    alias: str,
    run_ids: list[Any],
    *,
    status: str,
    error: Any,
    guard: Q | None = None,
) -> tuple[list[Any], set[Any]]:
    """
    ``end_runs`` in one transaction; returns the ids of the runs of
    ``run_ids`` it ended and those of the descendants it cancelled.
    """

    runs = WorkflowRun.objects.using(alias)

    def write() -> tuple[list[Any], set[Any]]:
        # Afresh on each try: a try the server rolled back ended nothing.
        ended: list[Any] = []
        children_ended: list[Any] = []
        descendants: set[Any] = set()
        take_write_lock(alias)
        for run_id in run_ids:
            parent_id = _lock_parent(alias, run_id)
            rows = runs.filter(pk=run_id).exclude(status__in=FINISHED_RUN_STATUSES)
            if guard is not None:
                rows = rows.filter(guard)
            stored = serialize_error(error(run_id))
            if rows.update(status=status, wake_at=None, error=stored, updated_at=DbNow()):
                _fence_steps(alias, [run_id], stored)
                ended.append(run_id)
                if parent_id is not None:
                    children_ended.append(run_id)
        frontier = list(ended)
        while frontier:
            frontier = _cancel_children(alias, frontier)
            descendants.update(frontier)
        # A top-level run has no parent step parked on it: only a child's end is handed on.
        for run_id in children_ended:
            settle_parent_step(alias, run_id)
        rollup.add_runs_within(alias, ended, status)
        return ended, descendants

    return in_transaction(alias, write)


def _cancel_children(alias: str, parent_ids: list[Any]) -> list[Any]:
    """Cancel the unfinished children of ``parent_ids``, fencing their steps; returns their ids."""

    runs = WorkflowRun.objects.using(alias)
    children = list(
        runs.filter(parent_id__in=parent_ids)
        .exclude(status__in=FINISHED_RUN_STATUSES)
        .values_list("pk", flat=True)
    )
    for child_id in children:
        stored = serialize_error(WorkflowCancelledError(child_id))
        runs.filter(pk=child_id).exclude(status__in=FINISHED_RUN_STATUSES).update(
            status="cancelled", wake_at=None, error=stored, updated_at=DbNow()
        )
        _fence_steps(alias, [child_id], stored)
    return children


def _lock_parent(alias: str, run_id: Any, parent_id: Any = UNKNOWN) -> Any:
    """
    Lock the parent run (if any) before the run itself; returns the parent's
    id (None for a top-level run or one that is not there). Every transaction
    here then takes rows parent first (parent run, its steps, the child run,
    the child's steps), so ending a child while its parent is cancelled
    queues one behind the other instead of deadlocking.
    """

    runs = WorkflowRun.objects.using(alias)
    if parent_id is UNKNOWN:
        parent_id = runs.filter(pk=run_id).values_list("parent_id", flat=True).first()
    if parent_id is not None:
        list(runs.select_for_update().filter(pk=parent_id).values_list("pk", flat=True))
    return parent_id


def _fence_steps(alias: str, run_ids: list[Any], error: dict[str, Any]) -> None:
    """Fail the in-flight steps of ended runs, so their workers are refused from now on."""

    steps = WorkflowStep.objects.using(alias).filter(run_id__in=run_ids, status__in=FENCED_STEP_STATUSES)
    # Locked, so a claim racing this fence waits for it and then finds the step failed.
    rows = list(steps.select_for_update().values_list("pk", "attempt"))
    if not rows:
        return
    steps.filter(pk__in=[pk for pk, _ in rows]).update(
        status="failed", error=error, result=None, lease_expires_at=None, updated_at=DbNow()
    )
    for step_id, attempt in rows:
        write_attempt(alias, step_id, attempt, "failed", error=error, failed_at=DbNow())
