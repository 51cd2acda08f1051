"""
A worker's loops, each a ``Poller``: its lanes (``Lane``, each driving one
run at a time), and beside them the sweep (every
``--sweep-interval`` seconds) and the scheduler (a ``tick()`` when the next
tick is due, and every ``SCHEDULE_REREAD_S`` besides). The PostgreSQL
wake-up listener is ``managers.wakeups.Listener``, the other databases'
wake-ups are in ``watchers``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from pikku_django.held import HOLD_WINDOW_S
from pikku_django.loops import Poller
from pikku_django.outages import ONCE_GIVES_UP_AFTER_S
from pikku_django.schedules import tick_until_next

if TYPE_CHECKING:
    from pikku_django.managers.names import NameLock
    from pikku_django.worker import Worker

logger = logging.getLogger(__name__)

#: Seconds between the scheduler's reads while no tick is due sooner: how
#: soon it sees a schedule resumed or changed by another process (a pause is
#: always seen: the pass at a tick's time reads the schedule first).
SCHEDULE_REREAD_S = 10.0
#: Seconds between the worker's sweeps that prune (dead leases, finished runs
#: past their retention): kept for days, they need no pass every few seconds,
#: and the prunes are half the reads of an idle pass.
SWEEP_PRUNE_S = 60.0
#: Added to the wait for a tick, so that the read after it finds it due on
#: the database clock rather than a moment before.
TICK_MARGIN_S = 0.005


class Lane(Poller):
    """
    One of a worker's lanes: drives one run at a time, on its own thread and
    database connection, under a holder name of its own. After a run it looks
    for the next at once; when nothing is due it waits for a wake-up or its
    interval.
    """

    def __init__(self, worker: Worker, index: int) -> None:
        super().__init__(f"pikku-lane-{index}", stop=worker.stopping, interval=worker.lane_interval())
        if worker.once:
            # Under cron, a run of --once must end: it gives up on a database
            # that stays out of reach.
            self.gives_up_after = ONCE_GIVES_UP_AFTER_S
        self.worker = worker
        self.holder = worker.lane_holder(index)
        self.idle = False
        # The lanes take turns to look while idle: together they look every
        # interval / concurrency, not all at once every interval.
        self.phase = self.interval * index / worker.concurrency

    def poll(self) -> bool:
        # A run's outcome rides on the lane's next take (``Worker.drive_next``).
        took = self.worker.drive_next(self.holder, hold=True)
        self.idle = not took
        return took

    def finished(self) -> bool:
        return (self.worker.once and self.idle) or self.worker.spent()

    def teardown(self) -> None:
        try:
            # The outcome of the lane's last run, when the lane stops right after it.
            self.worker.flush(self.holder)
        except Exception:
            logger.warning("%s could not write the outcome it held.", self.holder, exc_info=True)
        # The worker's own thread keeps its connections (a caller's, in tests).
        if threading.current_thread() is not self.worker.thread:
            super().teardown()


#: Seconds between two looks of an idle ``FlushLoop`` (while no lane holds an outcome).
FLUSH_IDLE_S = 0.25


class FlushLoop(Poller):
    """
    Writes the outcomes a lane has held longer than ``HOLD_WINDOW_S``
    (``held``) on a connection of its own, while that lane is busy with a
    run that turned out long: the outcomes of the short runs it drove before
    are reported within a few milliseconds, and their leases, no longer
    renewed, are released long before they could lapse.
    """

    wakes = False

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-flush", stop=worker.stopping, interval=HOLD_WINDOW_S)
        self.worker = worker

    def poll(self) -> bool:
        self.worker.write_stale()
        return False

    def _idle_wait(self) -> float:
        return self.interval if self.worker._held else FLUSH_IDLE_S


#: Seconds between two checks that the worker's name lock still has its session.
NAME_CHECK_S = 30.0


class NameLoop(Poller):
    """
    Keeps the lock on the worker's name (``managers.names``): every
    ``NAME_CHECK_S`` one cheap read on the lock's own connection; a session
    a server restart ended is opened again and the lock taken again. If
    another worker took the name meanwhile, this worker stops.
    """

    wakes = False
    interval = NAME_CHECK_S

    def __init__(self, worker: Worker, lock: NameLock) -> None:
        super().__init__("pikku-name", stop=worker.stopping)
        self.worker = worker
        self.lock = lock

    def poll(self) -> bool:
        if self.lock.holds():
            return False
        if self.lock.acquire():
            logger.info("Worker %s holds its name again.", self.worker.holder)
            return False
        logger.error("Worker %s lost its name to another worker; stopping.", self.worker.holder)
        self.worker.stop()
        return False


class SweepLoop(Poller):
    """
    The worker's sweep: one ``sweep()`` pass every ``--sweep-interval``
    seconds, its prunes in the first pass and then every ``SWEEP_PRUNE_S``.
    """

    wakes = False

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-sweep", stop=worker.stopping, interval=worker.sweep_interval)
        self.using = worker.using
        self.pruned_at = float("-inf")

    def poll(self) -> bool:
        from pikku_django.sweep import sweep

        prune = time.monotonic() - self.pruned_at >= SWEEP_PRUNE_S
        report = sweep(using=self.using, prune=prune)
        if prune:
            self.pruned_at = time.monotonic()
        logger.debug("Sweep: %s", report.summary())
        return False


class SchedulerLoop(Poller):
    """
    The worker's scheduler (safe on every worker at once): a
    ``schedules.tick()`` as the next tick falls due, and every
    ``SCHEDULE_REREAD_S`` meanwhile, rather than one a second. A tick the
    admin triggers needs no pass: its run is started, and wakes the lanes,
    by the trigger itself.
    """

    wakes = False

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-scheduler", stop=worker.stopping, interval=1.0)
        self.using = worker.using
        #: Seconds from the last pass's read to the next tick (None: none scheduled).
        self.next_in: float | None = None

    def poll(self) -> bool:
        _, self.next_in = tick_until_next(using=self.using)
        return False

    def _idle_wait(self) -> float:
        if self.next_in is None:
            return SCHEDULE_REREAD_S
        if self.next_in <= 0:
            # A tick this pass recorded (its schedule's row is read anew next
            # pass) or could not: today's cadence, a pass a second.
            return self.interval
        return min(SCHEDULE_REREAD_S, self.next_in + TICK_MARGIN_S)
