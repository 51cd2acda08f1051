"""
Deduplicated starts (``start_workflow(..., dedup_key=)``): at most one
unfinished run per (workflow, dedup_key). The unique constraint
``pikku_run_dedup_uniq`` over (workflow, ``dedup_active``) decides, not a
read: ``dedup_active`` is the run's ``dedup_key`` while the run is
unfinished and NULL once it ends (a stored generated column), so racing
starts in many processes insert one row, and the key is free again the
moment its run ends (completed, failed or cancelled).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, connections

from pikku_django import validate
from pikku_django.errors import DuplicateRunError, PikkuError
from pikku_django.models import WorkflowRun
from pikku_django.sql.conflicts import in_transaction

DedupMode = validate.DedupMode
DEDUP_MODES = validate.DEDUP_MODES

#: How often a start tries again when the run that held its key ended
#: between its insert and its read (each try is one read and one insert).
TRIES = 5


def start_deduplicated(
    alias: str,
    create: Callable[[], WorkflowRun],
    workflow: str,
    dedup_key: str,
    dedup: DedupMode,
    idempotency_key: str | None = None,
) -> WorkflowRun:
    """
    The new run ``create()`` inserts (in a savepoint inside a caller's
    transaction, so a lost race leaves it usable), unless an unfinished run
    of ``workflow`` holds ``dedup_key``: then that run (``dedup="return"``)
    or ``DuplicateRunError`` naming it (``"raise"``). A start whose
    ``idempotency_key`` already started a run gets that run.
    """
    runs = WorkflowRun.objects.db_manager(alias)
    for _ in range(TRIES):
        if idempotency_key is not None:
            started = runs.filter(idempotency_key=idempotency_key).first()
            if started is not None:
                return started
        holder = _unfinished(alias, workflow, dedup_key)
        if holder is not None:
            if dedup == "raise":
                raise DuplicateRunError(workflow, dedup_key, holder.pk)
            return holder
        try:
            return in_transaction(alias, create)
        except IntegrityError:
            # Another start won the key (or the idempotency key): read it.
            continue
    raise PikkuError(
        f"dedup_key {dedup_key!r}: runs of workflow {workflow!r} under it kept starting and ending "
        f"while this start tried {TRIES} times; start again."
    )


def _unfinished(alias: str, workflow: str, dedup_key: str) -> WorkflowRun | None:
    """
    The unfinished run of ``workflow`` under ``dedup_key``, or None. Inside a
    caller's transaction the read locks, so that under REPEATABLE READ
    (MySQL's and MariaDB's default) it reads the winner's committed row, not
    the transaction's older snapshot.
    """
    runs = WorkflowRun.objects.using(alias).filter(workflow=workflow, dedup_active=dedup_key)
    if connections[alias].in_atomic_block:
        runs = runs.select_for_update()
    return runs.first()
