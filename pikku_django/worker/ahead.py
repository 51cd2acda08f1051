"""
Runs taken ahead: while more runs are due than the worker has lanes, a lane
whose last pass was short takes several due runs in one commit
(``store.takes.take_run``'s ``ahead``) and drives them one after another,
holding their outcomes for its next take (``held``), so that a backlog of
short runs costs one commit per several. The lane that took them drives
them (``RunsAhead``) under the same fences as a run it takes alone; until
each one's pass starts, the process's keeper renews its leases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError

from pikku_django.conf import conf
from pikku_django.leases import KeepAlive, LeaseRenewal
from pikku_django.store.takes import Take, hand_back
from pikku_django.worker.held import HOLD_WINDOW_S
from pikku_django.workflows.attempts import StepLeaseRenewal
from pikku_django.workflows.registry import first_step_of

if TYPE_CHECKING:
    from pikku_django.worker.lane import Lane

logger = logging.getLogger("pikku_django.worker")

#: The most runs a lane takes in one commit (``how_many``).
TAKE_AHEAD = 8


def how_many(lane: Lane, due: int) -> int:
    """
    How many runs a take of ``lane``'s may take ahead of the one it drives
    first (``store.takes.take_run``): a lane whose last pass was short,
    while more runs are due than its worker has lanes, takes up to
    ``TAKE_AHEAD`` in one commit; otherwise one.
    """
    worker = lane.worker
    if worker.max_runs is not None or due <= worker.concurrency or not lane.short:
        return 0
    return max(0, min(TAKE_AHEAD, lane.room or TAKE_AHEAD) - 1)


@dataclass
class Waiting:
    """A run taken ahead, waiting for its pass; the process's keeper renews its leases meanwhile."""

    took: Take
    renewals: list[KeepAlive]

    def holds(self) -> bool:
        """True while the keeper knows its leases (run and step) to be this lane's."""
        return all(renewal.holds() for renewal in self.renewals)

    def stop(self) -> None:
        """Stop the keeper's renewals: its pass keeps its leases, or it is handed back."""
        while self.renewals:
            self.renewals.pop().stop()


def keep(took: Take, using: str, sent: float) -> Waiting:
    """
    Renew the leases of a run taken ahead (its run lease, and its step's when
    the take claimed it) through the process's keeper until its pass starts.
    ``sent``: when the take was sent (monotonic), no later than the grant.
    """
    assert took.lease is not None and took.run is not None
    renewals: list[KeepAlive] = [LeaseRenewal(took.lease, conf.LEASE_TTL_MS, using)]
    step = first_step_of(took.run)
    if took.steps and step is not None:
        renewals.append(StepLeaseRenewal(took.steps[0], step.lease_ms, using))
    for renewal in renewals:
        renewal.granted(sent)
        renewal.start()
    return Waiting(took, renewals)


def timed_drive(lane: Lane, took: Take, hold: bool, *, ahead: bool = False) -> None:
    """
    Drive a run the take got, and note whether its pass was short
    (``how_many``); ``ahead``: long after its take (``drive_run``'s ``taken_ahead``).
    Its outcome is held (``hold``) only when the take claimed its only step
    (a task's): claimed with runs ahead, that attempt is provisional, and a
    worker lost before writing it spends no budget of the run's; claimed
    alone, it is written with the lane's next take, moments later. A run
    whose steps its pass claims writes its outcome at once.
    """
    assert took.run is not None
    started = time.monotonic()
    hold = hold and took.steps is not None
    lane.drive(
        took.run, lease=took.lease, claimed=took.claimed, hold=hold, steps=took.steps, taken_ahead=ahead
    )
    # A pass this short (from its start to its outcome held) lets the lane's next take take runs ahead.
    lane.short = (time.monotonic() - started) * 1000 < conf.TAKE_AHEAD_BELOW_MS


class RunsAhead:
    """
    The runs a lane took ahead and has not started yet. The lane drives them
    one after another (``drive``); each is handed back instead (its claim and
    run lease given back, due at once, no budget spent: ``store.takes.hand_back``)
    once the worker is stopping, when the keeper cannot vouch for its leases
    (a pause past them), or, by the flush loop, when it has waited longer
    than the run lease's ttl behind a long run (``hand_back_late``).
    """

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self._waiting: deque[Waiting] = deque()
        self._since: float | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._waiting)

    def drive(self, took: Take, hold: bool, sent: float) -> None:
        """
        Drive the run a take got, then the runs it took ahead, one after
        another; outcomes held longer than ``HOLD_WINDOW_S`` are written
        before the next run starts. ``sent``: when the take was sent.
        """
        lane = self.lane
        # The runs taken ahead count as passes too (the first was reserved by its look).
        for _ in took.ahead:
            lane.worker.reserve()
        with self._lock:
            self._waiting.extend(keep(more, lane.using, sent) for more in took.ahead)
            self._since = time.monotonic()
        taken_at = time.monotonic()
        try:
            if took.lease is not None and took.run is not None:
                timed_drive(lane, took, hold)
            while (waiting := self._next()) is not None:
                if not self._may_start(waiting):
                    continue
                age = lane.held.age()
                if age is not None and age > HOLD_WINDOW_S:
                    lane.flush()
                # A run whose pass starts within the window of its take is
                # as fresh as a run a take gets for itself: its take's check
                # of the run's state holds. Later ones are checked again.
                stale = time.monotonic() - taken_at > HOLD_WINDOW_S
                timed_drive(lane, waiting.took, hold, ahead=stale)
        finally:
            # Those not driven (an outage, an abort): handed back if the database lets us.
            self.hand_back("its pass ended early")

    def _next(self) -> Waiting | None:
        with self._lock:
            if not self._waiting:
                self._since = None
                return None
            return self._waiting.popleft()

    def _may_start(self, waiting: Waiting) -> bool:
        """
        Whether the next run taken ahead may start: not once the worker is
        stopping (it and the rest are handed back), nor while the keeper
        cannot vouch for its leases (handed back, guarded by its own lease:
        a run another pass took meanwhile is left alone). Its pass keeps its
        leases from here on.
        """
        if self.lane.stopping.is_set():
            with self._lock:
                self._waiting.appendleft(waiting)
            self.hand_back("the worker is stopping")
            return False
        holds = waiting.holds()
        waiting.stop()
        if not holds:
            self._give_back([waiting], "its leases may have lapsed")
        return holds

    def hand_back_late(self) -> int:
        """Hand back every run waiting once the first has waited longer than the run lease's ttl."""
        with self._lock:
            since = self._since
        if since is None or time.monotonic() - since < conf.LEASE_TTL_MS / 1000:
            return 0
        return self.hand_back("they waited longer than the run lease behind a long run")

    def hand_back(self, reason: str) -> int:
        """Hand back every run still waiting; returns how many were given back."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            self._since = None
        for each in waiting:
            each.stop()
        return self._give_back(waiting, reason)

    def _give_back(self, waiting: list[Waiting], reason: str) -> int:
        if not waiting:
            return 0
        lane = self.lane
        try:
            given = hand_back(lane.using, [each.took for each in waiting])
        except DatabaseError:
            # Left to lapse, as a crash would leave them: due again once their leases run out.
            logger.warning(
                "%s could not hand back %s runs taken ahead.", lane.holder, len(waiting), exc_info=True
            )
            return 0
        finally:
            # Their places free once they are back (or left to lapse), not before.
            for _ in waiting:
                lane.worker.unreserve()
        logger.info("%s handed back %s runs taken ahead: %s.", lane.holder, given, reason)
        return given
