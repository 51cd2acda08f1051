"""
Runs taken ahead: while more runs are due than the worker has lanes, a lane
whose last pass was short takes several due runs in one commit
(``managers.takes.take_run``'s ``ahead``) and drives them one after another,
holding their outcomes for its next take (``held``), so that a backlog of
short runs costs one commit per several. ``Worker`` mixes this in with its
passes (``worker_passes``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from pikku_django.conf import conf
from pikku_django.held import HOLD_WINDOW_S, HeldOutcomes
from pikku_django.leases import KeepAlive, LeaseRenewal
from pikku_django.workflows.attempts import StepLeaseRenewal
from pikku_django.workflows.registry import first_step_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from pikku_django.managers.takes import Take

#: The most runs a lane takes in one commit (``AheadPasses._ahead``).
TAKE_AHEAD = 8
#: A pass this short (seconds, from its start to its outcome held) lets the
#: lane's next take take runs ahead.
SHORT_PASS_S = 0.005


def _keep_ahead(took: Take, using: str) -> list[KeepAlive]:
    """
    Renew the leases of a run taken ahead (its run lease, and its step's when
    the take claimed it) through the process's keeper until its pass starts.
    """
    assert took.lease is not None and took.run is not None
    renewals: list[KeepAlive] = [LeaseRenewal(took.lease, conf.LEASE_TTL_MS, using)]
    step = first_step_of(took.run)
    if took.steps and step is not None:
        renewals.append(StepLeaseRenewal(took.steps[0], step.lease_ms, using))
    for renewal in renewals:
        renewal.start()
    return renewals


class AheadPasses:
    """How many runs a lane takes at once, and how it drives those it took ahead."""

    using: str
    concurrency: int
    max_runs: int | None
    stopping: threading.Event
    _held: HeldOutcomes
    #: Whether each lane's last pass was short (``SHORT_PASS_S``).
    _short: dict[str, bool]
    #: How many more runs ``run_batch`` may drive (None outside it).
    _room: int | None
    #: ``WorkerPasses.drive``.
    drive: Callable[..., None]

    def _reserve(self) -> bool:
        raise NotImplementedError

    def flush(self, holder: str) -> None:
        raise NotImplementedError

    def _ahead(self, holder: str, due: int) -> int:
        """
        How many runs a take of ``holder``'s may take ahead of the one it
        drives first (``managers.takes.take_run``): a lane whose last pass
        was short, while more runs are due than this worker has lanes, takes
        up to ``TAKE_AHEAD`` in one commit; otherwise one.
        """
        if self.max_runs is not None or due <= self.concurrency or not self._short.get(holder, False):
            return 0
        return max(0, min(TAKE_AHEAD, self._room or TAKE_AHEAD) - 1)

    def _timed_drive(self, took: Take, holder: str, hold: bool, *, ahead: bool = False) -> None:
        """
        Drive a run the take got, and note whether its pass was short
        (``_ahead``); ``ahead``: long after its take (``drive_run``'s ``taken_ahead``).
        """
        assert took.run is not None
        started = time.monotonic()
        self.drive(
            took.run,
            holder,
            lease=took.lease,
            claimed=took.claimed,
            hold=hold,
            steps=took.steps,
            taken_ahead=ahead,
        )
        self._short[holder] = time.monotonic() - started < SHORT_PASS_S

    def _drive_ahead(self, took: Take, holder: str, hold: bool) -> None:
        """
        Drive the run a take got, then the runs it took ahead, one after
        another; each one's leases are kept by the process's keeper until
        its pass starts, and outcomes held longer than ``HOLD_WINDOW_S`` are
        written before the next run starts. Runs not driven (an outage, an
        abort) are left to lapse, as a crash would leave them.
        """
        # The runs taken ahead count as passes too (the first was reserved by its look).
        for _ in took.ahead:
            self._reserve()
        kept = [_keep_ahead(more, self.using) for more in took.ahead]
        runs = [(took, list[KeepAlive]()), *zip(took.ahead, kept, strict=True)]
        taken_at = time.monotonic()
        try:
            for index, (run, renewals) in enumerate(runs):
                # Its pass keeps its leases from here on.
                while renewals:
                    renewals.pop().stop()
                if run.lease is None or run.run is None:
                    continue
                age = self._held.age(holder)
                if age is not None and age > HOLD_WINDOW_S:
                    self.flush(holder)
                # A run whose pass starts within the window of its take is
                # as fresh as a run a take gets for itself: its take's check
                # of the run's state holds. Later ones are checked again.
                stale = index > 0 and time.monotonic() - taken_at > HOLD_WINDOW_S
                self._timed_drive(run, holder, hold, ahead=stale)
        finally:
            # Those of runs not driven (an outage, an abort), left to lapse.
            for _, renewals in runs:
                for renewal in renewals:
                    renewal.stop()
