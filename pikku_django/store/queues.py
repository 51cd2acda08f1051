"""
What an operator does to a queue: pause, resume, drain; and the queues'
rows made as needed (``sync_queues``). See ``models.WorkflowQueue``.
"""

from __future__ import annotations

import logging
from typing import Any

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.conf import conf
from pikku_django.managers.base import BULK_BATCH_RUNS, write_alias
from pikku_django.models import WorkflowQueue, WorkflowRun
from pikku_django.sql.conflicts import in_transaction
from pikku_django.store.lifecycle import cancel_runs
from pikku_django.wakeups import work_due

logger = logging.getLogger(__name__)


def sync_queues(*, using: str | None = None) -> int:
    """
    A ``WorkflowQueue`` row for every queue that has runs or is configured in
    ``PIKKU_QUEUES`` and has none yet; returns how many were made.
    """
    alias = write_alias(WorkflowQueue, using)
    names = set(conf.QUEUES)
    names.update(WorkflowRun.objects.using(alias).order_by().values_list("queue", flat=True).distinct())
    known = set(WorkflowQueue.objects.using(alias).values_list("name", flat=True))
    missing = sorted(names - known)
    if missing:
        made = [WorkflowQueue(name=name) for name in missing]
        WorkflowQueue.objects.using(alias).bulk_create(made, ignore_conflicts=True)
    return len(missing)


def set_paused(name: str, paused: bool, *, using: str | None = None) -> bool:
    """
    Pause (or resume) the queue ``name``, making its row if it has none;
    True if that changed it. Once a pause commits, no pass of the queue's
    runs starts (the take is guarded on it); passes in hand finish. A
    resume wakes idle workers, as its runs are due again.
    """
    validate.queue_name("name", name)
    alias = write_alias(WorkflowQueue, using)

    def write() -> bool:
        queues = WorkflowQueue.objects.using(alias)
        queues.bulk_create([WorkflowQueue(name=name)], ignore_conflicts=True)
        changed = queues.filter(name=name).exclude(paused=paused).update(paused=paused, changed_at=DbNow())
        if changed and not paused:
            work_due(alias)
        return bool(changed)

    changed = in_transaction(alias, write)
    if changed:
        logger.info("Queue %r %s.", name, "paused" if paused else "resumed")
    return changed


def pause_queue(name: str, *, using: str | None = None) -> bool:
    """Pause the queue ``name`` (``set_paused``); True if it was not paused."""
    return set_paused(name, True, using=using)


def resume_queue(name: str, *, using: str | None = None) -> bool:
    """Resume the queue ``name`` (``set_paused``); True if it was paused."""
    return set_paused(name, False, using=using)


def drain_queue(name: str, *, using: str | None = None, batch_size: int = BULK_BATCH_RUNS) -> int:
    """
    Cancel the due runs of the queue ``name`` (and their unfinished
    children), ``batch_size`` to a transaction, until a batch comes back
    short; runs a pass holds now, and those due later, are left. Returns
    how many were cancelled.
    """
    validate.queue_name("name", name)
    validate.whole("batch_size", batch_size, minimum=1, maximum=validate.MAX_INTEGER)
    alias = write_alias(WorkflowRun, using)
    cancelled = 0
    while True:
        due = WorkflowRun.objects.db_manager(alias).due().filter(queue=name).order_by()
        ids: list[Any] = list(due.values_list("pk", flat=True)[:batch_size])
        done = cancel_runs(alias, ids, batch_size=batch_size) if ids else 0
        cancelled += done
        if len(ids) < batch_size or not done:
            break
    if cancelled:
        logger.info("Queue %r drained: %s run(s) cancelled.", name, cancelled)
    return cancelled
