"""
A run's events and stream items, written: each inside a transaction that
first passes its writer's fence (``fenced_write``), so a writer that no longer
holds the run (a pass) or the step (an attempt) writes nothing.

Offsets are taken as the stream's highest plus one, under the unique (run,
stream, offset) constraint: a writer that raced another to an offset is
rolled back and sends its transaction again, so offsets stay dense and each
is taken once, and an offset k+1 commits only after k has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError
from django.db.models import Max

from pikku_django.clock import DbNow
from pikku_django.errors import StepSupersededError
from pikku_django.models import WorkflowEvent, WorkflowStep, WorkflowStreamItem
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import take_write_lock
from pikku_django.sql.notify import announce_results

T = TypeVar("T")

#: The ``rpc_name`` of a ``ctx.set_event`` step; ``data["key"]`` is the event's key, its result the value.
EVENT_RPC = "pikku.event"

#: The ``rpc_name`` of a ``ctx.publish`` step; ``data["stream"]`` is the stream, its result the item's offset.
PUBLISH_RPC = "pikku.publish"

#: How many times a write that raced another writer to a key or an offset is sent in all.
RACE_TRIES = 8


def put_event(alias: str, run_id: Any, key: str, value: Any) -> None:
    """Inside a fenced transaction: ``key``'s value for the run becomes ``value``."""
    events = WorkflowEvent.objects.using(alias)
    if not events.filter(run_id=run_id, key=key).update(value=value, updated_at=DbNow()):
        events.create(run_id=run_id, key=key, value=value, created_at=DbNow(), updated_at=DbNow())
    announce_results(alias, run_id)


def append_item(alias: str, run_id: Any, stream: str, item: Any) -> int:
    """Inside a fenced transaction: ``item`` appended to the run's ``stream``; returns its offset."""
    items = WorkflowStreamItem.objects.using(alias)
    last = items.filter(run_id=run_id, stream=stream).aggregate(last=Max("offset"))["last"]
    offset = 0 if last is None else int(last) + 1
    items.create(run_id=run_id, stream=stream, offset=offset, item=item, created_at=DbNow())
    announce_results(alias, run_id)
    return offset


def fenced_write(alias: str, write: Callable[[], T]) -> T:
    """
    ``write()`` in a transaction of its own (a savepoint inside a caller's),
    sent again when it lost a race to a key or an offset (IntegrityError)
    or met a conflict. ``write`` starts with its fence and starts afresh.
    """
    for tries in range(1, RACE_TRIES + 1):
        try:
            return in_transaction(alias, write)
        except IntegrityError:
            if tries == RACE_TRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def hold_attempt(alias: str, step_id: Any, attempt: int) -> None:
    """
    Inside a transaction: lock the step while ``attempt`` is its live one
    (still running), or raise ``StepSupersededError``. A claim of a newer
    attempt waits for this transaction, or has already fenced it out.
    """
    # SQLite: take the write lock before the read (see take_write_lock).
    take_write_lock(alias)
    live = (
        WorkflowStep.objects.using(alias)
        .filter(pk=step_id, attempt=attempt, status="running")
        .select_for_update()
        .values_list("pk", flat=True)
    )
    if not list(live):
        raise StepSupersededError(step_id, attempt)


def set_event_of_attempt(alias: str, run_id: Any, step_id: Any, attempt: int, key: str, value: Any) -> None:
    """Set the run's event ``key`` from inside a step, fenced to its live ``attempt``."""

    def write() -> None:
        hold_attempt(alias, step_id, attempt)
        put_event(alias, run_id, key, value)

    fenced_write(alias, write)


def publish_of_attempt(alias: str, run_id: Any, step_id: Any, attempt: int, stream: str, item: Any) -> int:
    """Append to the run's ``stream`` from inside a step, fenced to its live ``attempt``; the offset."""

    def write() -> int:
        hold_attempt(alias, step_id, attempt)
        return append_item(alias, run_id, stream, item)

    return fenced_write(alias, write)


__all__ = [
    "EVENT_RPC",
    "PUBLISH_RPC",
    "append_item",
    "fenced_write",
    "hold_attempt",
    "publish_of_attempt",
    "put_event",
    "set_event_of_attempt",
]
