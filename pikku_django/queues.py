"""
Global concurrency per queue (``PIKKU_QUEUES``): a run of a limited queue is
driven only while its worker holds one of the queue's slot leases,
``queue:<name>:0`` … ``queue:<name>:<concurrency - 1>``; and a run with a
``key`` on a queue with ``per_key.concurrency`` also holds one of its key's
slots, ``queue:<name>:key:<digest of the key>:<index>`` (``run_slots``).

The slots are ordinary leases of this app, judged on the database clock and
renewed while the run is driven, so the limit holds across every worker on
every host, and the slot of a worker that dies (even SIGKILLed) frees itself
once its lease lapses. Taking a slot never waits: a worker that finds every
slot taken moves on to other queues.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import LeaseTakenError
from pikku_django.leases import hold_lease
from pikku_django.managers.base import ACTIVE_RUN_STATUSES, write_alias
from pikku_django.models import WorkflowRun
from pikku_django.store import fairness, flow

logger = logging.getLogger(__name__)

#: How long a run whose key has every slot taken waits before a worker
#: looks at it again (its ``wake_at`` moves that far ahead of the DB clock's
#: now), so the due runs of other keys behind it come first meanwhile.
KEY_WAIT_MS = 250


def slot_keys(queue: str, concurrency: int) -> list[str]:
    """The lease keys of ``queue``'s slots."""
    return [f"queue:{queue}:{index}" for index in range(concurrency)]


@contextmanager
def queue_slot(queue: str, holder: str, *, using: str | None = None) -> Iterator[bool]:
    """
    Hold one free slot of ``queue`` while the body runs, and say whether the
    body may drive a run of it: True with a slot held (or when the queue has no
    limit), False when every slot is taken. A slot lost while the body ran
    (renewals refused) raises ``LeaseLostError`` on exit, like ``hold_lease``.
    """
    validate.queue_name("queue", queue)
    concurrency = conf.concurrency(queue)
    if concurrency is None:
        yield True
        return
    with one_of(slot_keys(queue, concurrency), holder, using=using) as held:
        if not held:
            logger.debug("Every slot of queue %r is taken.", queue)
        yield held


def key_slot_keys(queue: str, key: str, concurrency: int) -> list[str]:
    """The lease keys of the slots of ``key`` on ``queue`` (the key digested, so any key fits)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return [f"queue:{queue}:key:{digest}:{index}" for index in range(concurrency)]


@contextmanager
def one_of(keys: list[str], holder: str, *, using: str | None = None) -> Iterator[bool]:
    """Hold the first of ``keys`` no one else holds while the body runs; False if every one is held."""
    with ExitStack() as stack:
        for key in keys:
            try:
                stack.enter_context(hold_lease(key, conf.LEASE_TTL_MS, holder, using=using))
            except LeaseTakenError:
                continue
            logger.debug("%s holds %s.", holder, key)
            break
        else:
            yield False
            return
        yield True


@contextmanager
def run_slots(
    queue: str, run_id: Any, wake_at: int | None, holder: str, *, using: str | None = None
) -> Iterator[bool | None]:
    """
    Hold what driving the due run ``run_id`` of ``queue`` needs while the
    body runs: a slot of its queue (``queue_slot``); on a queue with
    ``per_key.concurrency``, a slot of the run's key; and on a queue with a
    ``rate``, the run's admission by its bucket (``store.flow``; once per
    run). True when the body may drive it; None when every slot of the
    queue is taken; False when its key's slots are (the run then waits
    ``KEY_WAIT_MS``) or its bucket is full (the run is made due at the next
    permitted instant), each move guarded by the ``wake_at`` read. Only a
    queue with a per-key limit or a rate reads the run (one SELECT); one
    with a per-key limit gives the run's key its turn (``store.fairness``).
    """
    with queue_slot(queue, holder, using=using) as slot:
        per_key = conf.per_key_concurrency(queue) if slot else None
        rate = conf.rate(queue) if slot else None
        if per_key is None and rate is None:
            yield slot or None
            return
        alias = write_alias(WorkflowRun, using)
        runs = WorkflowRun.objects.using(alias).filter(pk=run_id)
        key, rate_at = runs.values_list("key", "rate_at").first() or (None, 0)
        later: Any = None
        with ExitStack() as stack:
            free = per_key is None or key is None
            if not free:
                assert per_key is not None and key is not None
                free = stack.enter_context(one_of(key_slot_keys(queue, key, per_key), holder, using=alias))
                later = None if free else DbNowMs() + KEY_WAIT_MS
            if free and rate is not None and rate_at is None:
                later = flow.admit_run(alias, run_id, flow.bucket_key(queue, key, rate), rate)
                free = later is None
            if not free:
                logger.debug("Run %s of queue %r waits for its key's slots or its rate.", run_id, queue)
                runs.filter(status__in=ACTIVE_RUN_STATUSES, wake_at=wake_at).update(wake_at=later)
            elif per_key is not None:
                # Its key's turn is taken now: the next look serves the others first.
                fairness.served(alias, queue, key)
            yield free
