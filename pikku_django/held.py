"""
The outcomes a worker's lanes hold for their next take (``HeldFinish``), by
lane: a lane going through a backlog commits them with its next take, or
with the take after several runs taken ahead of others
(``managers.takes.take_run``). Reported nowhere until they commit, and
their leases no longer renewed, they are never held long: the worker's
``FlushLoop`` writes any held longer than ``HOLD_WINDOW_S`` while its lane
is busy with a run that turned out long.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pikku_django.managers.passes import HeldFinish

#: Outcomes held longer than this (seconds) are written without waiting for
#: their lane's next take.
HOLD_WINDOW_S = 0.01


class HeldOutcomes:
    """Each lane's held outcomes, oldest first; safe to use from the lanes and the flush loop at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, list[HeldFinish]] = {}
        self._since: dict[str, float] = {}

    def add(self, holder: str, finish: HeldFinish) -> None:
        with self._lock:
            held = self._held.setdefault(holder, [])
            if not held:
                self._since[holder] = time.monotonic()
            held.append(finish)

    def pop(self, holder: str) -> list[HeldFinish]:
        """Every outcome ``holder`` holds, now the caller's to write."""
        with self._lock:
            self._since.pop(holder, None)
            return self._held.pop(holder, [])

    def older_than(self, seconds: float) -> list[list[HeldFinish]]:
        """Pop every lane's outcomes whose oldest has been held longer than ``seconds``."""
        now = time.monotonic()
        with self._lock:
            stale = [holder for holder, since in self._since.items() if now - since > seconds]
            for holder in stale:
                del self._since[holder]
            return [self._held.pop(holder) for holder in stale]

    def age(self, holder: str) -> float | None:
        """Seconds since ``holder``'s oldest held outcome was held, or None."""
        with self._lock:
            since = self._since.get(holder)
        return None if since is None else time.monotonic() - since

    def holds(self, holder: str, run_id: Any) -> bool:
        with self._lock:
            return any(finish.run_id == run_id for finish in self._held.get(holder, ()))

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._held)

    def clear(self) -> None:
        """Forget every held outcome (as a crash would)."""
        with self._lock:
            self._held.clear()
            self._since.clear()
