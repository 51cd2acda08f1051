"""
The cockpit's per-minute rollup (``models.WorkflowMinute``): the transaction
that records runs' outcomes adds them to it, in one statement for the whole
batch (``add_within``), so the charts never count runs and the rollup costs
no commit of its own. A pass's start delay (the run's due time to its take,
on the database clock) is noted on the run as the take reads it
(``note_start``) and counted with the run's end. The sweep prunes the rows
older than ``KEEP_MS`` (``prune_minutes``), a bounded number a pass.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models.fields.json import KT

from pikku_django import sql
from pikku_django.clock import DbNowMs
from pikku_django.managers.base import WOKEN
from pikku_django.models import TASK_WORKFLOW, WorkflowMinute, WorkflowRun
from pikku_django.sql.cursors import hot_cursor
from pikku_django.sql.rollup import DELAY_BOUNDS_MS, DELAY_COLUMNS, ROW_KEYS

#: The run outcomes the rollup counts (a cancel is an operator's, not a run's).
COUNTED = ("completed", "failed")

#: How long the rollup's rows are kept: a day, and an hour for the day's chart to start full.
KEEP_MS = 25 * 3_600_000

#: The rows each (minute, queue, workflow) is spread over: each lane (a
#: thread of a process) adds to its own, so lanes ending runs of one
#: workflow at once do not queue on one row's lock.
SHARDS = 16

#: Where the take leaves a pass's start delay on the run it read (``note_start``).
_START_DELAY = "_pikku_start_delay_ms"


@dataclass(frozen=True)
class Ended:
    """One run's outcome, as the rollup counts it."""

    queue: str
    workflow: str
    status: str
    #: The start delay of the pass that ended it, in ms; None where its due time is not known.
    delay_ms: int | None = None


def chart_name(workflow: str, task: Any) -> str:
    """A run's name on the charts: its workflow's, or a Django task's dotted path (``task``)."""
    if workflow == TASK_WORKFLOW and isinstance(task, str) and task:
        return task
    return workflow


def note_start(run: WorkflowRun, read_wake_at: int | None, ttl_ms: int) -> None:
    """
    A take has just moved ``run`` (its ``wake_at`` now the take's now plus
    ``ttl_ms``), read due at ``read_wake_at``: note its start delay on it. A
    run woken out of turn (``WOKEN`` and below) has no due time to count from.
    """
    if read_wake_at is None or read_wake_at <= WOKEN or run.wake_at is None:
        return
    run.__dict__[_START_DELAY] = max(0, run.wake_at - ttl_ms - read_wake_at)


def ended(run: WorkflowRun | None, status: str) -> Ended | None:
    """``run``'s outcome ``status`` as the rollup counts it; None for one it does not count."""
    if run is None or status not in COUNTED:
        return None
    task = run.input.get("task") if isinstance(run.input, dict) else None
    return Ended(run.queue, chart_name(run.workflow, task), status, run.__dict__.get(_START_DELAY))


def bucket(delay_ms: int) -> int:
    """The index of the delay bucket ``delay_ms`` falls in (``DELAY_BOUNDS_MS``, bounds inclusive)."""
    return bisect.bisect_left(DELAY_BOUNDS_MS, delay_ms)


def rows(ends: Iterable[Ended]) -> list[dict[str, Any]]:
    """The upsert's rows (``sql.rollup``): one per (queue, workflow), its counts added up."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for end in ends:
        counts = grouped.setdefault((end.queue, end.workflow), [0] * (2 + len(DELAY_COLUMNS)))
        counts[0 if end.status == "completed" else 1] += 1
        if end.delay_ms is not None:
            counts[2 + bucket(end.delay_ms)] += 1
    return [
        {"q": queue, "w": workflow, **dict(zip(ROW_KEYS, counts, strict=True))}
        for (queue, workflow), counts in sorted(grouped.items())
    ]


def shard() -> int:
    """This thread's shard of a minute's rows (``SHARDS``)."""
    return zlib.crc32(f"{os.getpid()}:{threading.get_ident()}".encode()) % SHARDS


def add_within(alias: str, ends: Sequence[Ended | None]) -> None:
    """
    Add ``ends`` (None for an outcome not counted) to the database clock's
    current minute, in one statement in the caller's transaction; nothing is
    sent when none counts.
    """
    counted = rows(end for end in ends if end is not None)
    if not counted:
        return
    connection = connections[alias]
    with hot_cursor(connection) as cursor:
        cursor.execute(
            sql.statement("minute_add", connection), {"rows": json.dumps(counted), "shard": shard()}
        )


def add_runs_within(alias: str, run_ids: Sequence[Any], status: str) -> None:
    """
    ``add_within`` for runs ended with ``status`` outside a pass (a deadline
    passed): their queues and names read in one query, no start delay.
    """
    if status not in COUNTED or not run_ids:
        return
    named = WorkflowRun.objects.using(alias).filter(pk__in=list(run_ids))
    found = named.values_list("queue", "workflow", KT("input__task"))
    add_within(alias, [Ended(queue, chart_name(workflow, task), status) for queue, workflow, task in found])


def prune_minutes(limit: int, dry_run: bool, alias: str) -> int:
    """
    Delete up to ``limit`` rollup rows older than ``KEEP_MS`` on the database
    clock, oldest first; how many (with ``dry_run``, how many it would).
    An idle pass reads one index range and writes nothing.
    """
    minutes = WorkflowMinute.objects.using(alias)
    old = minutes.filter(minute__lt=DbNowMs() - KEEP_MS).order_by("minute")
    ids = list(old.values_list("pk", flat=True)[:limit])
    if dry_run or not ids:
        return len(ids)
    deleted, _ = minutes.filter(pk__in=ids).delete()
    return deleted
