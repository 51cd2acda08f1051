"""
The loops a worker runs beside its lanes (``lane.Lane``), each a
``Poller``: the writer of outcomes held too long, the lock on its name, the
sweep (every ``--sweep-interval`` seconds; ``pikku_sweep --loop`` runs it
too) and the scheduler (a ``tick()`` when the next tick is due, and every
``SCHEDULE_REREAD_S`` besides). What wakes the lanes on other processes'
commits is ``listener`` (PostgreSQL) and ``watchers`` (the others).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pikku_django.errors import InvalidArgumentError
from pikku_django.schedules import tick_until_next
from pikku_django.sweep import SweepReport, sweep
from pikku_django.worker.held import HOLD_WINDOW_S
from pikku_django.worker.poller import Poller
from pikku_django.workflows.in_progress import PENDING_WINDOW_S, holding, write_held_successes

if TYPE_CHECKING:
    from pikku_django.sql.names import NameLock
    from pikku_django.worker.process import Worker

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


#: Seconds between two looks of an idle ``FlushLoop`` (while no lane holds an outcome).
FLUSH_IDLE_S = 0.25


class FlushLoop(Poller):
    """
    Writes the outcomes a lane has held longer than ``HOLD_WINDOW_S``
    (``held``) on a connection of its own, while that lane is busy with a
    run that turned out long: the outcomes of the short runs it drove before
    are reported within a few milliseconds, and their leases, no longer
    renewed, are released long before they could lapse. Runs a lane took
    ahead and has kept waiting longer than the run lease's ttl behind such a
    run are handed back for other lanes and workers (``RunsAhead.hand_back_late``).
    A step success a pass has held ``PENDING_WINDOW_S`` while its workflow's
    code runs on is written too (``workflows.in_progress``).
    """

    wakes = False
    restarts = True

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-flush", stop=worker.stopping, interval=HOLD_WINDOW_S)
        self.worker = worker

    def poll(self) -> bool:
        for lane in self.worker.lanes:
            lane.write_stale()
            lane.ahead.hand_back_late()
        write_held_successes()
        return False

    def idle_wait(self) -> float:
        if any(lane.held for lane in self.worker.lanes):
            return self.interval
        return PENDING_WINDOW_S / 2 if holding() else FLUSH_IDLE_S


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
    restarts = True
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
    One ``sweep()`` pass every ``interval`` seconds, for a worker (its
    ``--sweep-interval``; prunes in the first pass, then every
    ``SWEEP_PRUNE_S``, each pass logged at DEBUG) and for ``pikku_sweep
    --loop`` (``options`` are ``sweep()``'s, ``report`` writes each pass,
    ``prune_every`` 0 prunes in every pass).
    """

    wakes = False
    restarts = True

    def __init__(
        self,
        worker: Worker | None = None,
        *,
        name: str = "pikku-sweep",
        interval: float | None = None,
        options: dict[str, Any] | None = None,
        report: Callable[[SweepReport], None] | None = None,
        prune_every: float = SWEEP_PRUNE_S,
    ) -> None:
        if interval is None:
            if worker is None or worker.sweep_interval is None:
                raise InvalidArgumentError("interval is needed by a sweep loop with no --sweep-interval.")
            interval = worker.sweep_interval
        super().__init__(name, stop=None if worker is None else worker.stopping, interval=interval)
        self.options = dict(options or {})
        if worker is not None:
            self.options.setdefault("using", worker.using)
        self.report = report or _log_sweep
        self.prune_every = prune_every
        #: A loop run in a command's own thread leaves the command its connections.
        self.own_thread = worker is not None
        self.pruned_at = float("-inf")

    def poll(self) -> bool:
        prune = time.monotonic() - self.pruned_at >= self.prune_every
        report = sweep(**self.options, prune=prune)
        if prune:
            self.pruned_at = time.monotonic()
        self.report(report)
        return False

    def teardown(self) -> None:
        if self.own_thread:
            super().teardown()


def _log_sweep(report: SweepReport) -> None:
    logger.debug("Sweep: %s", report.summary())


class SchedulerLoop(Poller):
    """
    The worker's scheduler (safe on every worker at once): a
    ``schedules.tick()`` as the next tick falls due, and every
    ``SCHEDULE_REREAD_S`` meanwhile, rather than one a second. A tick the
    admin triggers needs no pass: its run is started, and wakes the lanes,
    by the trigger itself.
    """

    wakes = False
    restarts = True

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-scheduler", stop=worker.stopping, interval=1.0)
        self.using = worker.using
        #: Seconds from the last pass's read to the next tick (None: none scheduled).
        self.next_in: float | None = None

    def poll(self) -> bool:
        _, self.next_in = tick_until_next(using=self.using)
        return False

    def idle_wait(self) -> float:
        if self.next_in is None:
            return SCHEDULE_REREAD_S
        if self.next_in <= 0:
            # A tick this pass recorded (its schedule's row is read anew next
            # pass) or could not: today's cadence, a pass a second.
            return self.interval
        return min(SCHEDULE_REREAD_S, self.next_in + TICK_MARGIN_S)
