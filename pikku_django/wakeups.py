"""
Wake-ups: a commit that makes work due wakes an idle worker at once instead
of leaving it to its next poll.

- Within one process, on every database: ``work_due()`` wakes one idle
  loop waiting in ``wait()`` once the transaction commits (``nudge()``); a
  lane that finds more due than the run it takes wakes the next, so a burst
  fans out lane by lane while a lone run wakes one lane, not every lane
  to race for it. ``notify()`` (a stop) wakes them all.
- Across processes on PostgreSQL: ``work_due()`` also sends ``NOTIFY`` on the
  channel ``pikku_work`` inside the transaction (so a rolled-back start wakes
  nobody, and at most one NOTIFY per transaction), and each worker's
  listener (``managers.wakeups.Listener``) turns it into a local wake-up.
- Across processes elsewhere: a loop of ``watchers`` nudges the lanes of
  its process: SQLite's file watcher (the database file changes on every
  commit); on MariaDB a watcher of the host's wake file, which ``work_due``
  changes after the commit (``wake_files``), and the due look for work made
  due on other hosts.
- A wake-up only shortens a wait, so a missed one costs latency, never work.
"""

from __future__ import annotations

import functools
import threading

from django.db import connections, transaction

from pikku_django.sql import wake_files
from pikku_django.sql.notify import announce

_cond = threading.Condition()
_generation = 0
#: A nudge no waiting loop has taken yet (at most one is kept: it makes the
#: next loop to wait look once more).
_nudged = False
_nudges = 0


def generation() -> int:
    """The current wake-up generation (to hand to ``wait()``)."""
    return _generation


def notify() -> None:
    """Wake every loop of this process that waits for work."""
    global _generation
    with _cond:
        _generation += 1
        _cond.notify_all()


def nudges() -> int:
    """How many nudges this process has sent."""
    return _nudges


def nudge() -> None:
    """Wake one loop of this process that waits for work (or, if none waits, the next to wait)."""
    global _nudged, _nudges
    with _cond:
        _nudged = True
        _nudges += 1
        _cond.notify()


def wait(seen: int, timeout: float, stop: threading.Event | None = None) -> int:
    """
    Wait up to ``timeout`` seconds for a wake-up after generation ``seen``, a
    nudge, or ``stop`` (which ``Poller.stop`` pairs with a ``notify()``);
    returns the generation now.
    """
    global _nudged
    with _cond:
        if _generation == seen and not _nudged and not (stop is not None and stop.is_set()):
            _cond.wait(timeout)
        _nudged = False
        return _generation


def _on_commit(using: str) -> None:
    nudge()
    wake_files.touch(using)


def work_due(using: str) -> None:
    """
    Say that the transaction in progress on ``using`` (or the autocommitted
    statement just run) made work due: idle workers are woken once it commits.
    """
    conn = connections[using]
    if conn.in_atomic_block:
        # Once per transaction: a callback of ours already waiting for this
        # commit means the announcement is sent. A rollback drops both.
        if any(getattr(entry[1], "func", None) is _on_commit for entry in conn.run_on_commit):
            return
        announce(using)
        transaction.on_commit(functools.partial(_on_commit, using), using=using)
        return
    announce(using)
    _on_commit(using)
