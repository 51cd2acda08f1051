"""
The workers' heartbeats (``models.WorkflowWorker``): each live worker
process writes its row every few seconds, judged on the database clock, and
deletes it when it stops; a row not written for ``QUIET_AFTER_MS`` is a
worker gone quiet (killed, or hung), pruned after ``FORGET_QUIET_MS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F

from pikku_django.clock import DbNowMs
from pikku_django.models import WorkflowQueue, WorkflowWorker
from pikku_django.sql.conflicts import in_transaction

#: A worker quiet this long (ms, on the database clock) has its row removed
#: by the next heartbeat of any worker.
FORGET_QUIET_MS = 3_600_000


@dataclass(frozen=True)
class Beat:
    """What a heartbeat writes of its worker."""

    holder: str
    host: str
    pid: int
    lanes: int
    queues: str
    runs_in_hand: int
    code_version: str = ""


def beat(alias: str, worker: Beat) -> frozenset[str]:
    """
    Write ``worker``'s heartbeat (its row, made if missing, ``seen_at`` now
    on the database clock), prune the rows of workers long quiet, and return
    the names of the paused queues, read in the same transaction.
    """

    def write() -> frozenset[str]:
        rows = WorkflowWorker.objects.using(alias)
        fields = {
            "host": worker.host,
            "pid": worker.pid,
            "lanes": worker.lanes,
            "queues": worker.queues,
            "runs_in_hand": worker.runs_in_hand,
            "code_version": worker.code_version,
        }
        if not rows.filter(holder=worker.holder).update(seen_at=DbNowMs(), **fields):
            rows.bulk_create(
                [WorkflowWorker(holder=worker.holder, started_at=0, seen_at=0, **fields)],
                ignore_conflicts=True,
            )
            rows.filter(holder=worker.holder).update(started_at=DbNowMs(), seen_at=DbNowMs())
        rows.filter(seen_at__lt=DbNowMs() - FORGET_QUIET_MS).delete()
        paused = WorkflowQueue.objects.using(alias).filter(paused=True).values_list("name", flat=True)
        return frozenset(paused)

    return in_transaction(alias, write)


def forget(alias: str, holder: str) -> int:
    """Remove the row of the worker ``holder`` (it stopped); how many rows went."""
    return WorkflowWorker.objects.using(alias).filter(holder=holder).delete()[0]


def quiet_since(alias: str, holder: str) -> int | None:
    """How long (ms, on the database clock) since ``holder``'s last heartbeat; None without a row."""
    row = (
        WorkflowWorker.objects.using(alias)
        .filter(holder=holder)
        .annotate(quiet=DbNowMs() - F("seen_at"))
        .values_list("quiet", flat=True)
        .first()
    )
    return None if row is None else int(row)
