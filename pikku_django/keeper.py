"""
One renewal thread per process for every step lease the process holds.

A thread per step would cost a thread start and a join on every step, which
on a fast database is a good share of a step's time. The keeper renews each
lease it keeps every third of that lease's ttl, on its own thread and its own
database connection (kept open between renewals, closed when a renewal
fails or nothing is left to keep), with the same rules as a lease's own renewal thread (``KeepAlive``):
a renewal that raises proves nothing, an answer of "not yours" sets ``lost``
at once.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from pikku_django.leases import KeepAlive


class Keeper:
    """Renews every ``KeepAlive`` handed to ``keep()`` until ``drop()``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, KeepAlive]] = []
        self._kept: set[KeepAlive] = set()
        self._in_flight: KeepAlive | None = None
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def keep(self, kept: KeepAlive) -> None:
        """Renew ``kept`` every ``kept.interval`` seconds from now on."""
        with self._cond:
            self._kept.add(kept)
            heapq.heappush(self._due, (time.monotonic() + kept.interval, next(self._order), kept))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pikku-keeper", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def drop(self, kept: KeepAlive) -> None:
        """Stop renewing ``kept``, waiting for a renewal of it in flight to finish."""
        with self._cond:
            self._kept.discard(kept)
            while self._in_flight is kept:
                self._cond.wait()
            # Dropped entries leave the heap lazily; don't let them pile up.
            if len(self._due) > 64 and len(self._due) > 4 * len(self._kept):
                self._due = [entry for entry in self._due if entry[2] in self._kept]
                heapq.heapify(self._due)
            if not self._kept:
                # Let the keeper see it is idle (and let go of its connection).
                self._cond.notify_all()

    def _next(self) -> KeepAlive:
        with self._cond:
            while True:
                while self._due and self._due[0][2] not in self._kept:
                    heapq.heappop(self._due)
                if not self._due:
                    # Idle: hold no database connection while nothing is kept.
                    for conn in connections.all(initialized_only=True):
                        conn.close()
                    self._cond.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                kept = heapq.heappop(self._due)[2]
                self._in_flight = kept
                return kept

    def _run(self) -> None:
        while True:
            kept = self._next()
            renewed = False
            try:
                renewed = kept._renew_once()
            finally:
                with self._cond:
                    self._in_flight = None
                    if renewed and kept in self._kept:
                        heapq.heappush(self._due, (time.monotonic() + kept.interval, next(self._order), kept))
                    elif kept in self._kept:
                        self._kept.discard(kept)
                    self._cond.notify_all()


_keeper = Keeper()


def keeper() -> Keeper:
    """This process's keeper."""
    return _keeper
