"""What every store shares: the autocommit rule, SQLite's clock parameter, stored errors."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from django.db import router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Model, Q

from pikku_django.errors import LeaseInTransactionError, RaisedBaseExceptionError

M = TypeVar("M", bound=Model)


def ensure_autocommit(connection: BaseDatabaseWrapper) -> None:
    """
    Refuse to run inside ``transaction.atomic()``: a lease written in an open
    transaction is invisible to other processes, and a rollback would hand its
    token out twice. The atomic blocks a Django ``TestCase`` wraps each test in
    are allowed, as ``atomic(durable=True)`` allows them.
    """
    if connection.in_atomic_block:
        if not getattr(connection.atomic_blocks[-1], "_from_testcase", False):
            raise LeaseInTransactionError(connection.alias)
    elif not connection.get_autocommit():
        raise LeaseInTransactionError(connection.alias)


FINISHED_RUN_STATUSES = ("completed", "failed", "cancelled")


def write_alias(model: type[Model], using: str | None) -> str:
    """
    The database a write of ``model`` goes to: ``using`` when given, else the
    router's ``db_for_write`` (never its ``db_for_read``: a replica refuses
    writes, and a read that decides a write must see the primary).
    """
    return using or router.db_for_write(model)


#: How many runs one transaction of a bulk action covers (cancelling or waking
#: a selection in the admin, ``WorkflowRunQuerySet.cancel()`` and ``wake()``).
#: Cancelling a run costs a handful of statements, so a batch holds SQLite's
#: write lock (row locks elsewhere) for a bounded time, and a lease renewal or
#: a worker's step gets in between two batches however large the selection.
BULK_BATCH_RUNS = 250


def batched(ids: Iterable[Any], size: int = BULK_BATCH_RUNS) -> Iterator[list[Any]]:
    """``ids`` in lists of at most ``size``, in order (``itertools.batched`` is Python 3.12+)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"batch_size: a batch holds at least one run, not {size!r}.")
    batch: list[Any] = []
    for item in ids:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


#: A run a worker may drive: running, or suspended on a wait that may time out.
ACTIVE_RUN_STATUSES = ("running", "suspended")

#: A run parked for a history that no longer fits its code (``PIKKU_ON_REPLAY_MISMATCH
#: = "park"``): suspended with its ``WorkflowReplayError`` stored. Nothing wakes it
#: (no signal, child, item or sweep); ``retry_workflow`` revives it.
PARKED = Q(status="suspended", error__isnull=False)

#: The ``wake_at`` of a run woken out of turn (by the admin, a sweep, or a step
#: that lost its worker): the epoch, so it is due at once *and* ahead of every
#: run that fell due in the ordinary way; a recovered run never waits behind a
#: backlog of fresh work.
WOKEN = 0

#: The lowest ``wake_at`` a bigint holds: the lower bound of the range of
#: runs woken out of turn (``not_queued()``).
MIN_WAKE_AT = -(2**63)

#: A step whose worker-loss budget is spent (the sweep asks it of running
#: steps under a lapsed lease): a workflow step on the last attempt its
#: current budget allows (``budget_base`` is the attempts spent before a
#: ``retry_workflow`` gave it a fresh one), a task's step once its losses
#: reach ``worker_losses`` (see ``WorkflowStep.is_exhausted``); never a step whose
#: attempt a take claimed (``provisional``), which a lost worker gives back.
SPENT = (
    Q(worker_losses__isnull=True, attempt__gte=F("budget_base") + F("retries") + 1)
    | Q(worker_losses__isnull=False, losses__gte=F("worker_losses"))
) & Q(provisional=False)

#: The sweep's back-off between two wakes of one idle run: 30 s, doubling to 10 min.
SWEEP_BACKOFF_MS = (30_000, 60_000, 120_000, 240_000, 480_000)
SWEEP_BACKOFF_MAX_MS = 600_000


def serialize_error(error: BaseException) -> dict[str, Any]:
    """
    An exception as the JSON stored on a failed step or run (a carried
    ``SystemExit`` or ``KeyboardInterrupt`` as itself): its message and
    traceback with NUL characters removed (PostgreSQL's jsonb cannot store
    them) and bounded in size, so recording a failure never fails on them.
    """
    if isinstance(error, RaisedBaseExceptionError):
        error = error.original
    cls = type(error)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": _bounded(_message(error), MAX_ERROR_MESSAGE_CHARS),
        "traceback": _bounded("".join(traceback.format_exception(error)), MAX_TRACEBACK_CHARS),
    }


#: How much of an error's message and traceback is stored (the traceback's
#: end, where the error was raised, is kept).
MAX_ERROR_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 64_000


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # an error whose __str__ raises is still recorded
        return f"<{type(error).__qualname__}: its message could not be read>"


def _bounded(text: str, limit: int) -> str:
    """
    ``text`` without NUL characters or lone surrogates (no database stores
    them), cut to ``limit`` characters around an elision mark.
    """
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if len(text) <= limit:
        return text
    mark = f"\n[... {len(text) - limit} characters left out ...]\n"
    head = limit // 4
    return text[:head] + mark + text[len(text) - (limit - head) :]
