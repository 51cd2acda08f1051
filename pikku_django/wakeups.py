"""
Wake-ups: a commit that makes work due wakes an idle worker at once instead
of leaving it to its next poll.

- Within one process, on every database: ``work_due()`` bumps a generation
  counter once the transaction commits, and every idle loop waiting in
  ``wait()`` looks again.
- Across processes on PostgreSQL: ``work_due()`` also sends ``NOTIFY`` on the
  channel ``pikku_work`` inside the transaction (so a rolled-back start wakes
  nobody, and at most one NOTIFY per transaction), and each worker's
  listener (``managers.wakeups.Listener``) turns it into a local wake-up.
- Elsewhere a worker polls; a wake-up only shortens a wait, so a missed one
  costs latency, never work.
"""

from __future__ import annotations

import threading

from django.db import connections, transaction

_cond = threading.Condition()
_generation = 0


def generation() -> int:
    """The current wake-up generation (to hand to ``wait()``)."""
    return _generation


def notify() -> None:
    """Wake every loop of this process that waits for work."""
    global _generation
    with _cond:
        _generation += 1
        _cond.notify_all()


def wait(seen: int, timeout: float, stop: threading.Event | None = None) -> int:
    """
    Wait up to ``timeout`` seconds for a wake-up after generation ``seen`` (or
    for ``stop``, which ``Poller.stop`` pairs with a ``notify()``); returns the
    generation now.
    """
    with _cond:
        if _generation == seen and not (stop is not None and stop.is_set()):
            _cond.wait(timeout)
        return _generation


def _on_commit() -> None:
    notify()


def work_due(using: str) -> None:
    """
    Say that the transaction in progress on ``using`` (or the autocommitted
    statement just run) made work due: idle workers are woken once it commits.
    """
    from pikku_django.managers.wakeups import announce

    conn = connections[using]
    if conn.in_atomic_block:
        # Once per transaction: a callback of ours already waiting for this
        # commit means the announcement is sent. A rollback drops both.
        if any(entry[1] is _on_commit for entry in conn.run_on_commit):
            return
        announce(using)
        transaction.on_commit(_on_commit, using=using)
        return
    announce(using)
    notify()
