"""
The workers' heartbeats (``models.WorkflowWorker``): each live worker
process keeps a row saying what it is (host, pid, lanes, queues, runs in
hand, code version), written when that changes, never merely to say it is
alive, and deletes it when it stops. Whether a worker lives is told by the
lock on its name (``sql.names.names_held``), which a process holds for as
long as it runs and lets go of when it dies, even SIGKILLed: an idle worker
writes nothing, and a killed one is known at once. A row whose worker is
gone is pruned once it is ``FORGET_QUIET_MS`` old.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Case, F, Q, Value, When

from pikku_django.clock import DbNowMs
from pikku_django.models import WorkflowQueue, WorkflowWorker
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.names import names_held

#: A row this old (ms, on the database clock) whose worker holds no name is
#: removed by the next heartbeat of any worker.
FORGET_QUIET_MS = 3_600_000

#: At most this many old rows are looked at by one heartbeat's pruning.
PRUNE_BATCH = 100


@dataclass(frozen=True)
class Beat:
    """What a heartbeat says of its worker."""

    holder: str
    host: str
    pid: int
    lanes: int
    queues: str
    runs_in_hand: int
    code_version: str = ""


def beat(alias: str, worker: Beat, written: Beat | None = None) -> frozenset[str]:
    """
    A heartbeat of ``worker``: its row written if it says something
    ``written`` (what this process last wrote; None before its first beat)
    does not, or if the row is missing; the rows of workers long gone
    pruned; and the names of the paused queues returned. A beat with nothing
    new sends two reads and commits nothing.
    """
    rows = WorkflowWorker.objects.using(alias)
    cutoff = DbNowMs() - FORGET_QUIET_MS
    # Its own row first (is it there?), then the oldest.
    own_first = Case(When(holder=worker.holder, then=Value(0)), default=Value(1))
    seen = set(
        rows.filter(Q(holder=worker.holder) | Q(seen_at__lt=cutoff))
        .order_by(own_first, "seen_at")
        .values_list("holder", flat=True)[: PRUNE_BATCH + 1]
    )
    if worker != written or worker.holder not in seen:
        in_transaction(alias, lambda: _write(alias, worker, first=written is None))
    old = seen - {worker.holder}
    if old:
        gone = old - names_held(alias, old)
        if gone:
            # Guarded again: a worker of that name that started meanwhile has written its row.
            rows.filter(holder__in=gone, seen_at__lt=cutoff).delete()
    return frozenset(WorkflowQueue.objects.using(alias).filter(paused=True).values_list("name", flat=True))


def _write(alias: str, worker: Beat, *, first: bool) -> None:
    """Write ``worker``'s row, made if missing; its start time reset at a process's ``first`` beat."""
    rows = WorkflowWorker.objects.using(alias)
    fields = {
        "host": worker.host,
        "pid": worker.pid,
        "lanes": worker.lanes,
        "queues": worker.queues,
        "runs_in_hand": worker.runs_in_hand,
        "code_version": worker.code_version,
    }
    now = {"started_at": DbNowMs(), "seen_at": DbNowMs()} if first else {"seen_at": DbNowMs()}
    if rows.filter(holder=worker.holder).update(**now, **fields):
        return
    rows.bulk_create(
        [WorkflowWorker(holder=worker.holder, started_at=0, seen_at=0, **fields)], ignore_conflicts=True
    )
    rows.filter(holder=worker.holder).update(started_at=DbNowMs(), seen_at=DbNowMs())


def forget(alias: str, holder: str) -> int:
    """Remove the row of the worker ``holder`` (it stopped); how many rows went."""
    return WorkflowWorker.objects.using(alias).filter(holder=holder).delete()[0]


def live_holders(alias: str, holders: Iterable[str]) -> set[str]:
    """Which of ``holders`` are live workers now: those holding their name's lock (one query)."""
    return names_held(alias, holders)


def quiet_since(alias: str, holder: str) -> int | None:
    """
    How long (ms, on the database clock) ``holder`` has been gone quiet: 0
    while it lives (holds its name), else since its row was last written;
    None without a row.
    """
    row = (
        WorkflowWorker.objects.using(alias)
        .filter(holder=holder)
        .annotate(quiet=DbNowMs() - F("seen_at"))
        .values_list("quiet", flat=True)
        .first()
    )
    if row is None:
        return None
    return 0 if live_holders(alias, [holder]) else int(row)
