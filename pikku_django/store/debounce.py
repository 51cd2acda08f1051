"""
Debounced starts (``start_workflow(..., key=, debounce_ms=)``): starts of
one workflow with one ``key`` within ``debounce_ms`` of each other make one
run, due ``debounce_ms`` after the last start and never later than
``debounce_max_ms`` after the first (``debounce_until``), with the last
start's input (``"last"``) or every start's input in order (``"collect"``).

The starts of one (workflow, key) are serialised by a row lock on a
``FlowBucket`` row of their own (``debounce:<workflow>:<digest>``). A start
joins the key's open run: a debounced run not yet due and never taken by a
worker (no run lease was ever written for it); its move of ``wake_at`` is
guarded by the value read, so a worker's take that moved it first (and
closed the burst) makes the start open a new run instead.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from django.db import IntegrityError
from django.db.models import F, Value
from django.db.models.functions import Least

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.models import FlowBucket, Lease, WorkflowRun
from pikku_django.sql.conflicts import in_transaction

DebounceMode = validate.DebounceMode
DEBOUNCE_MODES = validate.DEBOUNCE_MODES

#: ``debounce_until`` of a run with no ``debounce_max_ms``: no bound.
NO_BOUND = 2**62

#: Makes a new run: (input, wake_at, debounce_until) -> run.
Create = Callable[[Any, int, int], WorkflowRun]

#: A run's input with one more start's joined: (the open run's input, or None
#: for a new run, this start's input) -> the run's input.
Fold = Callable[[Any, Any], Any]


def fold_by_mode(mode: DebounceMode) -> Fold:
    """The default ``Fold``: the last start's input, or the list of every start's."""
    if mode == "last":
        return lambda _open, given: given
    return lambda open_input, given: [*open_input, given] if isinstance(open_input, list) else [given]


def start_debounced(
    alias: str,
    workflow: str,
    key: str,
    input: Any,
    *,
    debounce_ms: int,
    debounce_max_ms: int | None,
    mode: DebounceMode,
    create: Create,
    fold: Fold | None = None,
    among: Mapping[str, Any] | None = None,
) -> WorkflowRun:
    """
    The key's open run, delayed and given this start's input; or a new run
    (see above). ``fold``: how a start's input joins the run's (default:
    ``fold_by_mode(mode)``); ``among``: more filters an open run must meet
    (a task's path, as every task is a run of one workflow).
    """
    lock = f"debounce:{workflow}:{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    join = fold_by_mode(mode) if fold is None else fold

    def write() -> WorkflowRun:
        _lock(alias, lock)
        run = _join_open(alias, workflow, key, input, debounce_ms, join, among or {})
        if run is not None:
            return run
        now = Lease.objects.db_manager(alias).db_now_ms()
        until = NO_BOUND if debounce_max_ms is None else now + debounce_max_ms
        return create(join(None, input), min(now + debounce_ms, until), until)

    return in_transaction(alias, write)


def _lock(alias: str, lock: str) -> None:
    """
    Lock the row ``lock`` for the rest of the transaction, created first if
    missing. A write, not a read: on SQLite it takes the write lock at once
    (no upgrade to fail), and on MySQL/MariaDB the reads after it see every
    start committed before it (REPEATABLE READ takes its snapshot at the
    first plain read, which comes after the lock).
    """
    buckets = FlowBucket.objects.using(alias)
    if buckets.filter(key=lock).update(tat=F("tat") + 1):
        return
    # Another start may create it first; the UPDATE below then waits for its lock.
    with contextlib.suppress(IntegrityError):
        in_transaction(alias, lambda: FlowBucket(key=lock, tat=0).save(using=alias, force_insert=True))
    buckets.filter(key=lock).update(tat=F("tat") + 1)


def _join_open(
    alias: str, workflow: str, key: str, input: Any, debounce_ms: int, join: Fold, among: Mapping[str, Any]
) -> WorkflowRun | None:
    """The key's open run with this start joined (``wake_at`` and input moved, guarded), or None."""
    runs = WorkflowRun.objects.using(alias)
    open_runs = runs.filter(
        key=key, workflow=workflow, status="running", debounce_until__isnull=False, wake_at__gt=DbNowMs()
    )
    open_runs = open_runs.filter(**among).order_by("-wake_at")
    for run in open_runs[:2]:
        if Lease.objects.using(alias).filter(key=run.lease_key).exists():
            # A worker took it: its burst is closed.
            continue
        joined = join(run.input, input)
        validate.json_value("input", joined)
        wake_at = Least(DbNowMs() + Value(debounce_ms), F("debounce_until"))
        if runs.filter(pk=run.pk, wake_at=run.wake_at).update(wake_at=wake_at, input=joined):
            run.refresh_from_db(fields=["wake_at", "input"])
            return run
    return None
