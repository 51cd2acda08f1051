"""
The store of a fan-out (``ctx.map``, ``ctx.workflows``): its items' runs,
inserted in bounded batches and released in order, and what one item's end
does to its siblings and its parent.

An item is a run of its own whose ``parent_step`` is the parent's step and
whose ``parent_index`` is its place (unique together: each item starts once,
whatever the crashes and replays). Items beyond ``max_parallel`` wait
``suspended`` with no ``wake_at``, which no worker takes and no sweep wakes,
until an item ends and releases the next one. The end of one item is a
constant number of statements: lock the ``WorkflowFanOut`` row, count the
end, release the next item, and wake the parent once the last item has
ended; nothing re-counts the siblings.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from django.db.models import Exists, F, OuterRef

from pikku_django.clock import DbNow, DbNowMs, as_stored
from pikku_django.errors import ItemNotStartedError, WorkflowCancelledError
from pikku_django.managers.base import (
    ACTIVE_RUN_STATUSES,
    FINISHED_RUN_STATUSES,
    PARKED,
    WOKEN,
    serialize_error,
)
from pikku_django.managers.held import HELD as HELD
from pikku_django.managers.versions import code_version
from pikku_django.models import Lease, WorkflowFanOut, WorkflowRun, WorkflowStep
from pikku_django.models.fanout import FanOutKind
from pikku_django.wakeups import work_due

#: Items inserted per transaction, so a map of 10,000 items never holds the
#: write lock (SQLite's is the whole database's) for long.
INSERT_BATCH = 500


#: The ``rpc_name`` of a ``ctx.map`` step and of a ``ctx.workflows`` step.
MAP_RPC = "pikku.map"
WORKFLOWS_RPC = "pikku.workflows"
FAN_OUT_RPCS = (MAP_RPC, WORKFLOWS_RPC)


def insert_items(
    alias: str,
    parent: Any,
    step: Any,
    workflow: str,
    inputs: Sequence[Any],
    first_index: int,
    keys: Sequence[str | None] | None = None,
) -> None:
    """
    Insert the runs of ``inputs`` (items ``first_index`` on) as held items of
    ``step``, on the parent's queue and priority, each with its flow-control
    key from ``keys`` (none without), in one statement. A racing pass that
    inserted them first makes it raise IntegrityError.
    """

    now = datetime.datetime.fromtimestamp(
        Lease.objects.db_manager(alias).db_now_ms() / 1000, tz=datetime.timezone.utc
    )
    stamp = as_stored(now)
    version = code_version(workflow)
    WorkflowRun.objects.using(alias).bulk_create(
        [
            WorkflowRun(
                workflow=workflow,
                code_version=version,
                driven_version=version,
                status=HELD,
                input=value,
                wake_at=None,
                queue=parent.queue,
                priority=parent.priority,
                parent=parent,
                parent_step=step,
                parent_index=first_index + offset,
                key=None if keys is None else keys[offset],
                created_at=stamp,
                updated_at=stamp,
            )
            for offset, value in enumerate(inputs)
        ]
    )


def _held(alias: str, step_id: Any) -> Any:
    """The held items of the fan-out step ``step_id``: suspended with no ``wake_at``."""

    return WorkflowRun.objects.using(alias).filter(parent_step_id=step_id, status=HELD, wake_at__isnull=True)


def _make_due(items: Any) -> int:
    """Make the held ``items`` due now: the one "release" UPDATE; returns how many."""
    return int(items.update(status="running", wake_at=DbNowMs(), updated_at=DbNow()))


def release_first(alias: str, step_id: Any, count: int) -> int:
    """Make the first ``count`` held items of ``step_id`` due now; returns how many."""
    released = _make_due(_held(alias, step_id).filter(parent_index__lt=count))
    if released:
        work_due(alias)
    return released


def item_ended(alias: str, child_id: Any, parent_id: Any, step_id: Any, status: str) -> None:
    """
    The item ``child_id`` of the fan-out step ``step_id`` (of the run
    ``parent_id``) has ended with ``status``, in the transaction that ended
    it (the parent run already locked). Count it; on a success release the next held item; on the
    first failure or cancel halt the fan-out (``halt``); once every item has
    ended, wake the parent, once.
    """

    fan_outs = WorkflowFanOut.objects.using(alias)
    fan_out = fan_outs.select_for_update().filter(step_id=step_id).first()
    if fan_out is None:
        return
    ended = fan_out.ended + 1
    if status != "completed" and not fan_out.halted:
        fan_outs.filter(pk=step_id).update(ended=ended, halted=True, failed_run_id=child_id)
        if ended >= fan_out.total:
            _wake_parent(alias, parent_id)
        else:
            _halt(alias, fan_out, parent_id)
        return
    fields: dict[str, Any] = {"ended": ended}
    if not fan_out.halted and fan_out.released < fan_out.total:
        fields["released"] = release_next(alias, step_id, fan_out.released, fan_out.total)
    fan_outs.filter(pk=step_id).update(**fields)
    if ended >= fan_out.total:
        _wake_parent(alias, parent_id)


def release_next(alias: str, step_id: Any, cursor: int, total: int) -> int:
    """
    Make the first held item at or after ``cursor`` due; returns the cursor
    past it. In a fan-out as first started the item at ``cursor`` is held,
    and this is one UPDATE; after a retry some items ahead are already done,
    and a range read of the (parent_step, parent_index) index skips them
    (each once: the cursor moves past them).
    """
    held = _held(alias, step_id)
    if not _make_due(held.filter(parent_index=cursor)):
        ahead = held.filter(parent_index__gt=cursor).order_by("parent_index")
        found = ahead.values_list("parent_index", flat=True).first()
        cursor = total if found is None else int(found)
        if cursor >= total or not _make_due(held.filter(parent_index=cursor)):
            return total
    work_due(alias)
    return cursor + 1


def _halt(alias: str, fan_out: Any, parent_id: Any) -> None:
    """
    A failed or cancelled item stops its fan-out. A map's items not started
    yet (held, or due with no step begun) are cancelled and never start; its
    items in flight run to their end. A set of children is cancelled whole,
    each child with its own children. Every item so ended is counted (a
    child through ``item_ended``), and the last one wakes the parent.
    """
    # A cancelled item's end comes back here (``item_ended``): lifecycle and
    # fan-out call each other, so this one import waits for the call.
    from pikku_django.store.lifecycle import cancel_runs

    runs = WorkflowRun.objects.using(alias).filter(parent_step_id=fan_out.pk, status__in=ACTIVE_RUN_STATUSES)
    if fan_out.kind == FanOutKind.WORKFLOWS:
        cancel_runs(alias, list(runs.order_by("parent_index").values_list("pk", flat=True)))
        return
    begun = WorkflowStep.objects.using(alias).filter(run_id=OuterRef("pk"))
    error = serialize_error(ItemNotStartedError(parent_id, fan_out.step_id))
    cancelled = runs.exclude(Exists(begun)).update(
        status="cancelled", wake_at=None, error=error, updated_at=DbNow()
    )
    if cancelled:
        fan_outs = WorkflowFanOut.objects.using(alias).filter(pk=fan_out.pk)
        fan_outs.update(ended=F("ended") + cancelled)
        if fan_outs.filter(ended__gte=F("total")).exists():
            _wake_parent(alias, parent_id)


def _wake_parent(alias: str, parent_id: Any) -> None:
    """Every item has ended: wake the run whose step waits on them."""

    woken = (
        WorkflowRun.objects.using(alias)
        .filter(pk=parent_id, status__in=ACTIVE_RUN_STATUSES)
        .exclude(PARKED)
        .update(status="running", wake_at=WOKEN, updated_at=DbNow())
    )
    if woken:
        work_due(alias)


def outputs(alias: str, step_id: Any) -> list[Any]:
    """Every item's output, in the order of its items."""

    rows = WorkflowRun.objects.using(alias).filter(parent_step_id=step_id).order_by("parent_index")
    return list(rows.values_list("output", flat=True))


def failed_item(alias: str, fan_out: Any) -> dict[str, Any]:
    """The error a halted fan-out's step fails with: its first failed item's, and which item."""

    row = (
        WorkflowRun.objects.using(alias)
        .filter(pk=fan_out.failed_run_id)
        .values("pk", "status", "error", "parent_index")
        .first()
    )
    if row is None or row["status"] not in FINISHED_RUN_STATUSES:
        return serialize_error(WorkflowCancelledError(fan_out.failed_run_id))
    error = row["error"] or serialize_error(WorkflowCancelledError(row["pk"]))
    return {**error, "child_run": str(row["pk"]), "item": row["parent_index"]}
