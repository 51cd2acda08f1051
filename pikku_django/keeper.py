"""
One renewal thread per process for every lease the process holds: run
leases, step leases, queue slots, and the leases of ``hold_lease``.

A thread per step would cost a thread start and a join on every step, which
on a fast database is a good share of a step's time. The keeper renews each
lease it keeps every third of that lease's ttl, on its own thread and its own
database connection (kept open between renewals, closed when nothing is
left to keep), with the rules of ``KeepAlive``: a renewal that raises proves
nothing, an answer of "not yours" sets ``lost`` at once. Renewals due
together are sent together: one UPDATE per table (run leases and queue slots
in ``pikku_lease``, step leases in the step table), not one per lease.
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
        self._in_flight: set[KeepAlive] = set()
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
            while kept in self._in_flight:
                self._cond.wait()
            # Dropped entries leave the heap lazily; don't let them pile up.
            if len(self._due) > 64 and len(self._due) > 4 * len(self._kept):
                self._due = [entry for entry in self._due if entry[2] in self._kept]
                heapq.heapify(self._due)
            if not self._kept:
                # Let the keeper see it is idle (and let go of its connection).
                self._cond.notify_all()

    def _next(self) -> list[KeepAlive]:
        """
        Wait for the next renewal that is due, and take with it every other
        renewal due within a third of its interval: they are sent together.
        """
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
                first = heapq.heappop(self._due)[2]
                taken = [first]
                horizon = time.monotonic() + first.interval / 3
                while self._due and self._due[0][0] <= horizon:
                    kept = heapq.heappop(self._due)[2]
                    if kept in self._kept and kept not in taken:
                        taken.append(kept)
                self._in_flight = set(taken)
                return taken

    def _run(self) -> None:
        while True:
            taken = self._next()
            outcomes: dict[KeepAlive, bool] = {}
            try:
                for group in _batches(taken):
                    outcomes.update(_renew(group))
            finally:
                with self._cond:
                    self._in_flight = set()
                    for kept in taken:
                        if outcomes.get(kept) and kept in self._kept:
                            heapq.heappush(
                                self._due, (time.monotonic() + kept.interval, next(self._order), kept)
                            )
                        else:
                            self._kept.discard(kept)
                    self._cond.notify_all()


def _batches(taken: list[KeepAlive]) -> list[list[KeepAlive]]:
    """``taken`` grouped by batch key, in order; a renewal with no key is a group of its own."""
    groups: dict[object, list[KeepAlive]] = {}
    for kept in taken:
        key = kept.batch_key()
        groups.setdefault(key if key is not None else object(), []).append(kept)
    return list(groups.values())


def _renew(group: list[KeepAlive]) -> dict[KeepAlive, bool]:
    """One renewal of every lease of ``group``: whether each is still to be kept."""
    if len(group) == 1:
        return {group[0]: group[0]._renew_once()}
    sent = time.monotonic()
    try:
        answers = type(group[0]).renew_all(group)
    except Exception as error:
        return {kept: kept._failed(error) for kept in group}
    return {kept: kept._answered(renewed, sent) for kept, renewed in zip(group, answers, strict=True)}


_keeper = Keeper()


def keeper() -> Keeper:
    """This process's keeper."""
    return _keeper
