"""
Rate limits of flow control (``PIKKU_QUEUES[q]["rate"]``): GCRA, one row per
bucket (``FlowBucket``), judged on the database clock.

A bucket's ``tat`` is the theoretical arrival time of its next start. With
``interval`` = ⌈``period_ms`` / ``limit``⌉ and ``tolerance`` = ``burst`` ×
``interval``, a start at the DB clock's ``now`` is let through when
``tat − now ≤ tolerance``, and moves ``tat`` to ``max(tat, now) + interval``:
one guarded UPDATE decides it, so two workers never both take the last
place, whatever their own clocks say. So for any starts i < j of a bucket,
``t[j] − t[i] ≥ (j − i) × interval − tolerance``, hence
``t[i + limit + burst] − t[i] ≥ limit × interval ≥ period_ms``. A start
refused may start at ``tat − tolerance``: the run is made due then (it
waits; it is never dropped).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import IntegrityError
from django.db.models import F
from django.db.models.functions import Greatest

from pikku_django.clock import DbNowMs
from pikku_django.models import FlowBucket, WorkflowRun
from pikku_django.sql.conflicts import in_transaction


class _Refused(Exception):
    """Rolls back a run's admission: its bucket is full until ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at


def bucket_key(queue: str, key: str | None, rate: dict[str, Any]) -> str:
    """The bucket of a run of ``queue``: the queue's, or its key's with ``rate["per_key"]``."""
    if rate.get("per_key") and key is not None:
        return f"rate:{queue}:key:{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    return f"rate:{queue}"


def admit_run(alias: str, run_id: Any, bucket: str, rate: dict[str, Any]) -> int | None:
    """
    Let the run ``run_id`` start under ``bucket``'s rate, in one transaction:
    its ``rate_at`` set to now (once: a run admitted before is not counted
    again) and the bucket advanced. None when it may start now; else the
    DB-clock instant (epoch ms) from which it may, and nothing is written.
    """

    def write() -> None:
        runs = WorkflowRun.objects.using(alias).filter(pk=run_id, rate_at__isnull=True)
        if not runs.update(rate_at=DbNowMs()):
            # Admitted already (another lane, or an earlier pass).
            return
        at = admit(alias, bucket, rate["limit"], rate["period_ms"], rate.get("burst", 0))
        if at is not None:
            raise _Refused(at)

    try:
        in_transaction(alias, write)
    except _Refused as refused:
        return refused.at
    return None


def admit(alias: str, bucket: str, limit: int, period_ms: int, burst: int) -> int | None:
    """
    One start under ``bucket`` (GCRA, see above): None if let through (the
    bucket advanced), else the DB-clock instant from which a start may be.
    The guarded UPDATE decides; a bucket's first start inserts its row.
    """
    interval = -(-period_ms // limit)
    tolerance = burst * interval
    buckets = FlowBucket.objects.using(alias)
    while True:
        if buckets.filter(key=bucket, tat__lte=DbNowMs() + tolerance).update(
            tat=Greatest(F("tat"), DbNowMs()) + interval
        ):
            return None
        tat = buckets.filter(key=bucket).values_list("tat", flat=True).first()
        if tat is not None:
            return int(tat) - tolerance
        try:
            in_transaction(
                alias,
                lambda: FlowBucket(key=bucket, tat=DbNowMs() + interval).save(using=alias, force_insert=True),
            )
        except IntegrityError:
            # Another start inserted it first: try its guard.
            continue
        return None
