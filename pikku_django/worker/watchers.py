"""
Wake-ups across processes where the database sends none: one loop per worker
process notices other processes' commits and wakes its idle lanes
(``wakeups.nudge()``), so that a run started elsewhere starts at once and
the lanes' own polls are only a fallback. PostgreSQL needs neither: its
NOTIFY reaches the listener (``managers.wakeups.Listener``).

- SQLite (a database file): ``FileWatcher`` stats the file and its ``-wal``
  every ``FILE_WATCH_S``; any process's commit changes one of them. It sends
  no statement at all. An in-memory database is never shared with another
  process, so it gets no watcher.
- Any other database (MariaDB): a ``FileWatcher`` on the host's wake file
  (``wake_files``), which every commit that makes work due changes, for
  work made due on this host; and ``DueLook``, for work made due on other
  hosts: it runs the lanes' due query (``Worker.due``, compiled once) for
  one run every ``LOOK_S`` and wakes them when it finds one, again every
  ``--interval`` while that run stays due. The lanes' own polls drop to
  every ``LANE_FALLBACK_S``: one look for the process instead of one per lane.

A missed change costs latency, never work: the lanes still poll.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from pikku_django import wakeups
from pikku_django.sql.notify import carries_notifications, looks_for_lanes, watched_files
from pikku_django.worker.poller import Poller

if TYPE_CHECKING:
    from pikku_django.worker.process import Worker

logger = logging.getLogger(__name__)

#: Seconds between two looks at the SQLite files.
FILE_WATCH_S = 0.015
#: The least time between two wake-ups a FileWatcher sends: a busy lane's
#: own commits would otherwise wake the idle ones on each of them.
FILE_WAKE_GAP_S = 0.02
#: Seconds between two due looks of a DueLook (at most ``--interval``).
LOOK_S = 0.12
#: Seconds between an idle lane's own looks where a DueLook looks for it
#: (or ``--interval``, if longer).
LANE_FALLBACK_S = 30.0

#: What identifies a file's content for us: (inode, size, mtime_ns), None when missing.
Signature = tuple[int, int, int] | None


def signature(path: str) -> Signature:
    """
    The stat of ``path`` that a commit changes; None if it does not exist or
    is empty (a connection that opens a WAL database creates an empty -wal).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st.st_size else None


class FileWatcher(Poller):
    """
    Wakes this process's lanes when one of ``paths`` changes: the SQLite
    database file or its write-ahead log (a commit, by this process or
    another; a checkpoint, too), or a wake file (``wake_files``).
    A change seen within ``FILE_WAKE_GAP_S`` of the last wake-up is woken for
    once that gap has passed, so a burst of commits wakes the lanes a few times,
    not once per commit.
    """

    wakes = False
    restarts = True
    interval = FILE_WATCH_S

    def __init__(self, *paths: str, **kwargs: Any) -> None:
        super().__init__(f"pikku-file-watcher:{os.path.basename(paths[0])}", **kwargs)
        self.paths = paths
        self.seen = self.look()
        self.pending = False
        self.woke_at = float("-inf")

    def look(self) -> tuple[Signature, ...]:
        return tuple(signature(path) for path in self.paths)

    def poll(self) -> bool:
        now = self.look()
        if now != self.seen:
            self.seen = now
            self.pending = True
        if self.pending and time.monotonic() - self.woke_at >= FILE_WAKE_GAP_S:
            self.pending = False
            self.woke_at = time.monotonic()
            wakeups.nudge()
        return False

    def teardown(self) -> None:
        """It opened no connection."""


class DueLook(Poller):
    """
    Looks for one due run of the worker's queues every ``LOOK_S`` (the
    lanes' own query, ``Worker.due``) and wakes the lanes when there is one:
    at once for a run not seen due before, else every ``--interval`` (a run
    the lanes left due, its queue's slots all taken, is looked at again as
    often as they would have polled).
    """

    wakes = False
    restarts = True

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-due-look", stop=worker.stopping, interval=min(LOOK_S, worker.interval))
        self.worker = worker
        self.seen: tuple[Any, int | None] | None = None
        self.woke_at = float("-inf")

    def poll(self) -> bool:
        due = self.worker.due(limit=1)
        first = (due[0][0], due[0][1]) if due else None
        if first is None:
            self.seen = None
            return False
        if first != self.seen or time.monotonic() - self.woke_at >= self.worker.interval:
            self.seen = first
            self.woke_at = time.monotonic()
            wakeups.nudge()
        return False


def watchers(worker: Worker) -> list[Poller]:
    """The loops that wake ``worker``'s lanes on other processes' commits, where its database needs them."""
    if carries_notifications(worker.using):
        return []
    loops: list[Poller] = [DueLook(worker)] if looks_for_lanes(worker.using) else []
    paths = watched_files(worker.using)
    if paths:
        loops.append(FileWatcher(*paths, stop=worker.stopping))
    return loops
