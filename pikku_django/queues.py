"""
Global concurrency per queue (``PIKKU_QUEUES``): a run of a limited queue is
driven only while its worker holds one of the queue's slot leases,
``queue:<name>:0`` … ``queue:<name>:<concurrency - 1>``.

The slots are ordinary leases of this app, judged on the database clock and
renewed while the run is driven, so the limit holds across every worker on
every host, and the slot of a worker that dies (even SIGKILLed) frees itself
once its lease lapses. Taking a slot never waits: a worker that finds every
slot taken moves on to other queues.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from pikku_django import validate
from pikku_django.conf import conf
from pikku_django.errors import LeaseTakenError
from pikku_django.leases import hold_lease

logger = logging.getLogger(__name__)


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
    with ExitStack() as stack:
        for key in slot_keys(queue, concurrency):
            try:
                stack.enter_context(hold_lease(key, conf.LEASE_TTL_MS, holder, using=using))
            except LeaseTakenError:
                continue
            logger.debug("%s holds %s.", holder, key)
            break
        else:
            logger.debug("Every slot of queue %r is taken.", queue)
            yield False
            return
        yield True
