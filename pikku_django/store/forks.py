"""
What ``fork_run`` copies from the original into its fork: the succeeded
steps before the step it forks from, and what the original had told its
readers by then, its stream items and its events.

The fork point is the moment the original first wrote that step (its
``created_at``). A stream is copied as the dense run of offsets from 0 up to
the first item written after that moment, or published by workflow code at
or after that step, whichever comes first: the fork publishes those again
when it runs on, so no offset is written twice and the copied ``pikku.publish``
steps replay the offsets their items have in the fork. An event is copied
with the value it held at the fork point: the value of its row when nothing
set it since, else the last value workflow code set before the step (a
``pikku.event`` step keeps it); a key that only a step had set before the
fork point and something set again after it is not copied.

Everything is written in the original's order (steps, items and events by
the time the original wrote them), each on the database clock, so a fork of
the fork is cut the same way.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db.models import Min, Q

from pikku_django.clock import DbNow
from pikku_django.models import (
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
    WorkflowStreamItem,
)
from pikku_django.store.events import EVENT_RPC, PUBLISH_RPC

#: One thing to write in the fork: when the original wrote it, its order among equals, the write.
Entry = tuple[datetime.datetime, int, Callable[[], None]]


def copy_history(
    alias: str,
    original_id: Any,
    fork: WorkflowRun,
    before: list[WorkflowStep],
    after: list[WorkflowStep],
) -> None:
    """
    Copy into ``fork`` the succeeded steps of ``before`` (the original's steps
    before the fork point, in order) and the stream items and events the
    original had written when it first wrote ``after[0]`` (the fork point).
    """
    until = after[0].created_at
    entries: list[Entry] = []
    for index, step in enumerate(before):
        if step.status == "succeeded":
            entries.append((step.created_at, 2 * index, partial(copy_step, alias, fork, step)))
    for stream, offset, item, at in _items_before(alias, original_id, after, until):
        row = WorkflowStreamItem(run=fork, stream=stream, offset=offset, item=item, created_at=DbNow())
        entries.append((at, -1, partial(row.save, force_insert=True, using=alias)))
    for at, order, key, value in _events_at(alias, original_id, before, until):
        entries.append((at, order, partial(_copy_event, alias, fork, key, value)))
    # The original's order; the sort is stable, so a stream's items stay in offset order.
    entries.sort(key=lambda entry: (entry[0], entry[1]))
    for _, _, write in entries:
        write()


def copy_step(alias: str, fork: WorkflowRun, step: WorkflowStep) -> None:
    """A succeeded ``step`` copied to ``fork``, succeeded, with one succeeded attempt."""
    copy = WorkflowStep.objects.using(alias).create(
        run=fork,
        step_name=step.step_name,
        rpc_name=step.rpc_name,
        data=step.data,
        status="succeeded",
        result=step.result,
        retries=step.retries,
        retry_delay=step.retry_delay,
        attempt=1,
        created_at=DbNow(),
        updated_at=DbNow(),
    )
    WorkflowStepAttempt.objects.using(alias).create(
        step=copy,
        attempt=1,
        status="succeeded",
        result=step.result,
        created_at=DbNow(),
        succeeded_at=DbNow(),
    )


def _items_before(
    alias: str, original_id: Any, after: list[WorkflowStep], until: datetime.datetime
) -> list[tuple[str, int, Any, datetime.datetime]]:
    """(stream, offset, item, created_at) of the items before the fork point, dense from 0 per stream."""
    items = WorkflowStreamItem.objects.using(alias).filter(run_id=original_id)
    later = items.filter(created_at__gt=until).order_by().values("stream").annotate(first=Min("offset"))
    cut = {row["stream"]: int(row["first"]) for row in later}
    for step in after:
        stream = (step.data or {}).get("stream")
        if step.rpc_name == PUBLISH_RPC and isinstance(stream, str) and isinstance(step.result, int):
            cut[stream] = min(cut.get(stream, step.result), step.result)
    if cut:
        kept = ~Q(stream__in=list(cut))
        for stream, first in cut.items():
            kept |= Q(stream=stream, offset__lt=first)
        items = items.filter(kept)
    rows = items.order_by("stream", "offset")
    return [
        (stream, int(offset), item, at)
        for stream, offset, item, at in rows.values_list("stream", "offset", "item", "created_at")
    ]


def _events_at(
    alias: str, original_id: Any, before: list[WorkflowStep], until: datetime.datetime
) -> list[tuple[datetime.datetime, int, str, Any]]:
    """(when, order, key, value) of each event as it stood at the fork point (see the module's doc)."""
    rows = WorkflowEvent.objects.using(alias).filter(run_id=original_id)
    held: dict[str, tuple[datetime.datetime, int, Any]] = {}
    for key, value, updated_at in rows.values_list("key", "value", "updated_at"):
        if updated_at <= until:
            # Nothing set it after the fork point: its row is what it held there.
            held[key] = (updated_at, -1, value)
    last: dict[str, tuple[datetime.datetime, int, Any]] = {}
    for index, step in enumerate(before):
        name = (step.data or {}).get("key") if step.rpc_name == EVENT_RPC else None
        if isinstance(name, str) and name not in held:
            # Just after its step, which it follows in the fork as in the original.
            last[name] = (step.created_at, 2 * index + 1, step.result)
    return [(at, order, key, value) for key, (at, order, value) in {**held, **last}.items()]


def _copy_event(alias: str, fork: WorkflowRun, key: str, value: Any) -> None:
    WorkflowEvent.objects.using(alias).create(
        run=fork, key=key, value=value, created_at=DbNow(), updated_at=DbNow()
    )


__all__ = ["copy_history", "copy_step"]
