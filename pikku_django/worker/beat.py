"""
The worker's heartbeat (``store.workers``): every ``BEAT_S`` it reads which
queues are paused and logs a pause or a resume of a queue this worker
drives, and writes the process's row for the admin's Workers page only when
what the row says changed (its first beat; runs in hand, say). Whether the
worker lives is told by the lock on its name, not by the row: an idle
worker commits nothing after its first beat.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from pikku_django.store.workers import Beat, beat, forget
from pikku_django.worker.poller import Poller

if TYPE_CHECKING:
    from pikku_django.worker.process import Worker

logger = logging.getLogger(__name__)

#: Seconds between two heartbeats of a worker (how soon a pause is logged, or runs in hand shown).
BEAT_S = 5.0


class BeatLoop(Poller):
    """A worker's heartbeat, and its log of the queues paused and resumed."""

    wakes = False
    restarts = True
    interval = BEAT_S

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-beat", stop=worker.stopping)
        self.worker = worker
        self.paused: frozenset[str] = frozenset()
        #: What this process last wrote of itself (None: nothing yet).
        self.written: Beat | None = None

    def poll(self) -> bool:
        worker = self.worker
        # A lane that has not looked yet holds nothing (its idle flag is not set before its first look).
        in_hand = sum(1 for lane in worker.lanes if lane.polled and not lane.idle) + sum(
            len(lane.ahead) for lane in worker.lanes
        )
        now = Beat(
            holder=worker.holder,
            host=socket.gethostname(),
            pid=os.getpid(),
            lanes=worker.concurrency,
            queues=",".join(worker.queues or ()),
            runs_in_hand=in_hand,
        )
        paused = beat(worker.using, now, self.written)
        self.written = now
        self.log_changes(paused)
        return False

    def log_changes(self, paused: frozenset[str]) -> None:
        """Log each queue this worker drives that was paused or resumed since the last heartbeat."""
        mine = self.worker.queues
        for name in sorted(paused - self.paused):
            if mine is None or name in mine:
                logger.warning(
                    "Queue %r is paused: worker %s starts none of its runs.", name, self.worker.holder
                )
        for name in sorted(self.paused - paused):
            if mine is None or name in mine:
                logger.warning("Queue %r is resumed: worker %s runs it again.", name, self.worker.holder)
        self.paused = paused

    def teardown(self) -> None:
        try:
            forget(self.worker.using, self.worker.holder)
        except Exception:
            # The row goes quiet and is pruned later; a worker stopping must not fail for it.
            logger.debug("Worker %s could not remove its heartbeat row.", self.worker.holder, exc_info=True)
        super().teardown()
