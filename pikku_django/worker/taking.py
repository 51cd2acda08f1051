"""
The due runs a worker's lanes are taking. Lanes woken together read much
the same due list; each take is guarded in the database, so two lanes never
both take a run, but the one that loses spends a round trip per run it
tries (on MySQL/MariaDB, a whole batch of statements). So a lane leaves out
of its candidates the runs another lane of this process is taking, and
those another lane took after its own look began (its look may have read
them before that take committed). Nothing here decides a take: a run left
out is taken by the lane that has it, or, if that take fails, by the next
look.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

#: Runs taken are remembered this long (seconds): longer than any look a lane
#: began before their take committed takes to be filtered.
REMEMBER_S = 5.0


class Taking:
    """Which due runs this process's lanes are taking, and took lately; safe to use from every lane."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[Any] = set()
        self._taken: dict[Any, float] = {}
        self._pruned = time.monotonic()

    def busy(self) -> int:
        """How many runs other lanes are taking now (a look reads that many more)."""
        return len(self._busy)

    def claim(self, due: Sequence[tuple[Any, ...]], since: float) -> list[tuple[Any, ...]]:
        """
        ``due`` (rows whose first item is a run id) less the runs another lane
        is taking, and those taken at or after ``since`` (``time.monotonic()``
        when the look that read ``due`` began).
        """
        with self._lock:
            return [row for row in due if self._free(row[0], since)]

    def start(self, run_ids: Sequence[Any], since: float, *, keep: int) -> list[Any]:
        """
        Of ``run_ids``, in order, those the caller, whose look began at
        ``since``, may try (``claim``'s test, again); the first ``keep`` of
        them are marked as its own until ``end``. The rest are fallbacks,
        tried only if a run before them is taken elsewhere (another process),
        so two lanes rarely meet on one.
        """
        with self._lock:
            free = [run_id for run_id in run_ids if self._free(run_id, since)]
            self._busy.update(free[:keep])
            return free

    def _free(self, run_id: Any, since: float) -> bool:
        """Is ``run_id`` neither being taken nor taken since ``since``? (Under the lock.)"""
        return run_id not in self._busy and self._taken.get(run_id, -1.0) < since

    def end(self, run_ids: Iterable[Any], taken: Iterable[Any]) -> None:
        """The caller's take of ``run_ids`` (``start``'s first ``keep``) has ended, with ``taken`` taken."""
        now = time.monotonic()
        with self._lock:
            self._busy.difference_update(run_ids)
            for run_id in taken:
                self._taken[run_id] = now
            if now - self._pruned > REMEMBER_S:
                self._taken = {key: at for key, at in self._taken.items() if now - at < REMEMBER_S}
                self._pruned = now
