"""
The outcomes a lane holds for its next take (``HeldFinish``): a lane going
through a backlog commits them with its next take, or with the take after
several runs taken ahead of others (``store.takes.take_run``). Reported
nowhere until they commit, and their leases no longer renewed, they are
never held long: the worker's ``FlushLoop`` writes any held longer than
``HOLD_WINDOW_S`` while their lane is busy with a run that turned out long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.sql.conflicts import is_conflict
from pikku_django.store.passes import HeldFinish, write_held

logger = logging.getLogger("pikku_django.worker")

#: Outcomes held longer than this (seconds) are written without waiting for
#: their lane's next take.
HOLD_WINDOW_S = 0.01


class HeldOutcomes:
    """One lane's held outcomes, oldest first; safe to use from the lane and the flush loop at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[HeldFinish] = []
        self._since: float | None = None

    def add(self, finish: HeldFinish) -> None:
        with self._lock:
            if not self._held:
                self._since = time.monotonic()
            self._held.append(finish)

    def pop(self) -> list[HeldFinish]:
        """Every outcome held, now the caller's to write."""
        with self._lock:
            held, self._held, self._since = self._held, [], None
            return held

    def pop_older_than(self, seconds: float) -> list[HeldFinish]:
        """``pop()`` if the oldest outcome has been held longer than ``seconds``, else nothing."""
        with self._lock:
            if self._since is None or time.monotonic() - self._since <= seconds:
                return []
            held, self._held, self._since = self._held, [], None
            return held

    def age(self) -> float | None:
        """Seconds since the oldest outcome held was held, or None."""
        with self._lock:
            since = self._since
        return None if since is None else time.monotonic() - since

    def holds(self, run_id: Any) -> bool:
        with self._lock:
            return any(finish.run_id == run_id for finish in self._held)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._held)

    def clear(self) -> None:
        """Forget every outcome held (as a crash would)."""
        with self._lock:
            self._held, self._since = [], None


def write_alone(using: str, finishes: Sequence[HeldFinish]) -> None:
    """Held outcomes in one commit of their own, or, if that fails, each in its own."""
    if len(finishes) > 1:
        try:
            write_held(using, finishes)
            return
        except OUTAGE_ERRORS as error:
            if not is_conflict(error):
                # Lost: their steps run again once their leases lapse.
                raise
            logger.warning(
                "Writing %s held outcomes together met conflicts; writing each alone.", len(finishes)
            )
        except DatabaseError:
            logger.exception("Writing %s held outcomes together failed; writing each alone.", len(finishes))
    for finish in finishes:
        finish.alone()
