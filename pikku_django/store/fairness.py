"""
Fairness among the keys of a queue with ``per_key`` (docs/flow-control.md):
among its due runs, the key served longest ago goes first, so one key's
10,000 due runs delay another key's first run by at most one take per lane.

Each take of a run of such a queue gives its key the queue's next turn
(``served``): a count per queue (the ``FlowBucket`` row ``served:<queue>``)
advanced by one guarded UPDATE, and written on the key's ``FlowKey`` row,
in one transaction. A count, not a time, so two takes in one millisecond
still order their keys. The due look of such a queue (``fair_due``) orders
its due runs by priority, then by their key's turn (a key never served
first), then by due time; the look of a queue without ``per_key`` is left
as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError
from django.db.models import BigIntegerField, CharField, F, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce

from pikku_django.conf import conf
from pikku_django.models import FlowBucket, FlowKey, WorkflowRun
from pikku_django.sql.conflicts import in_transaction

#: The key of the runs of a queue with ``per_key`` that have none: they take turns as one key.
NO_KEY = ""

#: A due run as the worker's look gives it: (id, wake_at, queue).
Due = tuple[Any, int | None, str]


def served(alias: str, queue: str, key: str | None) -> int:
    """Give ``key`` (of ``queue``) the queue's next turn; returns it."""
    counter = f"served:{queue}"
    buckets = FlowBucket.objects.using(alias)
    keys = FlowKey.objects.using(alias)
    key = NO_KEY if key is None else key

    def write() -> int:
        if not buckets.filter(key=counter).update(tat=F("tat") + 1):
            # The queue's first take; another may insert the row first, then the UPDATE waits for it.
            with contextlib.suppress(IntegrityError):
                in_transaction(
                    alias, lambda: FlowBucket(key=counter, tat=0).save(using=alias, force_insert=True)
                )
            buckets.filter(key=counter).update(tat=F("tat") + 1)
        # Its own write, read back under the row's lock.
        turn = int(buckets.filter(key=counter).values_list("tat", flat=True).get())
        if keys.filter(queue=queue, key=key).update(served=turn):
            return turn
        try:
            in_transaction(alias, lambda: keys.create(queue=queue, key=key, served=turn))
        except IntegrityError:
            # Another take of the key inserted it first.
            keys.filter(queue=queue, key=key).update(served=turn)
        return turn

    return in_transaction(alias, write)


def fair_queues(due: Sequence[Due]) -> set[str]:
    """The queues of ``due`` that have ``per_key`` (none, without any in ``PIKKU_QUEUES``)."""
    configured = conf.QUEUES
    if not any(options.get("per_key") for options in configured.values()):
        return set()
    return {queue for _, _, queue in due if (configured.get(queue) or {}).get("per_key")}


def fair_due(alias: str, due: list[Due]) -> list[Due]:
    """
    ``due`` (the worker's look) with the runs of each queue with ``per_key``
    replaced, place by place, by that queue's due runs in fair order
    (``fair_runs``): as many as the look found. ``due`` itself when it has
    none of them.
    """
    queues = fair_queues(due)
    if not queues:
        return due
    picks = {queue: iter(fair_runs(alias, queue, sum(1 for *_, q in due if q == queue))) for queue in queues}
    fair = (
        next(picks[queue], None) if queue in picks else (pk, wake_at, queue) for pk, wake_at, queue in due
    )
    return [row for row in fair if row is not None]


def fair_runs(alias: str, queue: str, limit: int) -> list[Due]:
    """
    Up to ``limit`` due runs of ``queue``: highest priority first, then the
    key served longest ago (a key never served first), then the earliest
    ``wake_at``. One statement: the due runs of the queue, each key's turn
    read by a subquery of the unique (queue, key) index.
    """
    own_key = Coalesce(OuterRef("key"), Value(NO_KEY), output_field=CharField())
    turns = FlowKey.objects.using(alias).filter(queue=OuterRef("queue"), key=own_key)
    turn = Coalesce(Subquery(turns.values("served")[:1]), Value(0), output_field=BigIntegerField())
    runs = WorkflowRun.objects.db_manager(alias).get_queryset().due().unpaused().filter(queue=queue)
    rows = (
        runs.annotate(turn=turn)
        .order_by("-priority", "turn", "wake_at")
        .values_list("pk", "wake_at", "queue")
    )
    return list(rows[:limit])
