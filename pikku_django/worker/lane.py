"""
A lane of a worker: drives one run at a time, on its own thread and
database connection, under a holder name of its own. It owns its pass (look
for due runs, take one with its run lease, and a task's step, in one
commit, drive it under a slot of its queue), the outcomes it holds for its
next take (``held``) and the runs it took ahead (``ahead``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from pikku_django import wakeups
from pikku_django.conf import conf
from pikku_django.errors import LeaseLostError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.outages import ONCE_GIVES_UP_AFTER_S, OUTAGE_ERRORS
from pikku_django.queues import run_slots
from pikku_django.sql.conflicts import is_conflict
from pikku_django.store.passes import HeldFinish
from pikku_django.store.takes import Take, take_run
from pikku_django.worker import ahead as runs_ahead
from pikku_django.worker.held import HOLD_WINDOW_S, HeldOutcomes, write_alone
from pikku_django.worker.poller import Poller, refresh_connections
from pikku_django.workflows.context import RETRY_SOON_MS
from pikku_django.workflows.registry import first_step_of
from pikku_django.workflows.runner import drive_run

if TYPE_CHECKING:
    from pikku_django.worker.process import Worker

logger = logging.getLogger("pikku_django.worker")

#: How many due runs after the first a take may fall back on in its commit.
ALTERNATES = 8
#: How many looks a lane makes in one ``drive_next`` while every run each
#: finds is another lane's.
LOOKS = 3


class Lane(Poller):
    """
    One of a worker's lanes. After a run it looks for the next at once; when
    nothing is due it waits for a wake-up or its interval.
    """

    def __init__(self, worker: Worker, index: int) -> None:
        super().__init__(f"pikku-lane-{index}", stop=worker.stopping, interval=worker.lane_interval())
        if worker.once:
            # Under cron, a run of --once must end: it gives up on a database
            # that stays out of reach.
            self.gives_up_after = ONCE_GIVES_UP_AFTER_S
        self.worker = worker
        self.using = worker.using
        self.holder = worker.lane_holder(index)
        self.idle = False
        # The lanes take turns to look while idle: together they look every
        # interval / concurrency, not all at once every interval.
        self.phase = self.interval * index / worker.concurrency
        #: The outcomes this lane holds for its next take.
        self.held = HeldOutcomes()
        #: Whether its last pass was short (``PIKKU_TAKE_AHEAD_BELOW_MS``).
        self.short = False
        #: How many more runs ``run_batch`` may drive (None outside it).
        self.room: int | None = None
        #: The runs it took ahead, waiting for their pass.
        self.ahead = runs_ahead.RunsAhead(self)

    # -- the loop ---------------------------------------------------------------------

    def poll(self) -> bool:
        # A run's outcome rides on the lane's next take.
        took = self.drive_next(hold=True)
        self.idle = not took
        return took

    def finished(self) -> bool:
        return (self.worker.once and self.idle) or self.worker.spent()

    def teardown(self) -> None:
        try:
            # The outcome of the lane's last run, when the lane stops right after it.
            self.flush()
        except Exception:
            logger.warning("%s could not write the outcome it held.", self.holder, exc_info=True)
        # The worker's own thread keeps its connections (a caller's, in tests).
        if threading.current_thread() is not self.worker.thread:
            super().teardown()

    def run_batch(self) -> int:
        """Drive up to the worker's ``batch`` due runs one after another in this thread; returns how many."""
        worker = self.worker
        took = 0
        full: set[str] = set()
        start = worker.passes
        try:
            while took < worker.batch and not self.stopping.is_set():
                # A take may take runs ahead, but no more than the batch has room for.
                self.room = worker.batch - took
                if not self.drive_next(full=full, hold=True):
                    break
                took = worker.passes - start
                refresh_connections()
        finally:
            self.room = None
            self.flush()
        return took

    # -- one pass ---------------------------------------------------------------------

    def drive_next(self, full: set[str] | None = None, *, hold: bool = False) -> bool:
        """
        Take the first due run no other lane takes first and drive it under a
        slot of its queue (``take_next``); False when nothing is due that this
        lane may take. The outcomes it holds are written when it takes
        nothing, or fails.
        """
        try:
            took = self.take_next(full, hold=hold)
        except BaseException:
            try:
                self.flush()
            except Exception:
                # Lost: its step runs again once its leases lapse.
                logger.warning("%s could not write the outcome it held.", self.holder, exc_info=True)
            raise
        if not took:
            self.flush()
        return took

    def take_next(self, full: set[str] | None = None, *, hold: bool = False) -> bool:
        """
        ``drive_next`` without writing the outcomes held when nothing is
        taken. Looked up afresh before every pass, so a run woken out of
        turn (``wake_at`` 0: its step lost its worker, or the admin woke it)
        is driven next, ahead of a backlog of its priority that only waits
        its turn. A queue found with every slot taken joins ``full`` and is
        left out.

        ``hold``: the outcome of a run with no parent and no queue limit is
        kept for this lane's next take, which commits it (one commit per run
        for a lane going from run to run).
        """
        worker = self.worker
        full = set() if full is None else full
        looks = 0
        while not self.stopping.is_set():
            newly_full = False
            looks += 1
            since = time.monotonic()
            # Past the runs other lanes of this process are taking, which it leaves to them.
            looked = worker.due(exclude=full)
            due = worker.taking.claim(looked, since)
            if looked and not due and looks < LOOKS:
                # Every run seen was another lane's: what they took is gone from a new look.
                continue
            if len(due) > 1:
                # More is due than this lane takes: wake one more idle lane
                # for the next (which does the same), so a burst fans out.
                wakeups.nudge()
            tried: set[Any] = set()
            for index, (run_id, wake_at, queue) in enumerate(due):
                if queue in full or run_id in tried:
                    continue
                if not worker.reserve():
                    return False
                alternates = [] if conf.is_limited(queue) else _alternates(due[index + 1 :], full)
                more = runs_ahead.how_many(self, len(looked)) if hold and alternates else 0
                outcome = self.take_and_drive(
                    run_id, wake_at, queue, hold=hold, alternates=alternates, ahead=more, since=since
                )
                if outcome:
                    return True
                worker.unreserve()
                tried.update(other for other, _ in alternates)
                if outcome is None:
                    full.add(queue)
                    newly_full = True
            # Look again only when a queue filled up: its runs may have hidden
            # due runs of other queues from this look.
            if not newly_full:
                return False
        return False

    def take_and_drive(
        self,
        run_id: Any,
        wake_at: int | None,
        queue: str,
        *,
        hold: bool = False,
        alternates: Sequence[tuple[Any, int | None]] = (),
        ahead: int = 0,
        since: float | None = None,
    ) -> bool | None:
        """
        Drive one due run under a slot of its queue: True if it was driven,
        False if another lane took it first, None if every slot of its
        queue is taken (the run stays due). ``alternates``: due runs of
        queues with no limit, taken instead in the same commit, in order,
        if this one is not (``store.takes.take_run``); ``ahead``: how many
        of them may be taken too, and driven after it (``RunsAhead.drive``);
        ``since``: when the look that found them began (``take``).
        """
        try:
            with run_slots(queue, run_id, wake_at, self.holder, using=self.using) as slot:
                if not slot:
                    return slot
                sent = time.monotonic()
                took = self.take(run_id, wake_at, alternates=alternates, ahead=ahead, since=since)
                if took.ahead:
                    # Only ever with alternates: of queues with no limit, like this one.
                    self.ahead.drive(took, hold, sent)
                    return True
                if not took.taken:
                    return False
                if took.lease is None:
                    # Its run lease is another pass's: the take made it due a little later.
                    return True
                if took.run is None:
                    return False
                # A queue's slot is let go at the end of this block: its run's
                # outcome must have committed by then.
                keeps = hold and not conf.is_limited(queue)
                runs_ahead.timed_drive(self, took, keeps)
                return True
        except LeaseLostError:
            # The pass is over; its writes were fenced by their own leases.
            logger.warning("%s lost its slot of queue %r while driving run %s.", self.holder, queue, run_id)
            return True

    def take(
        self,
        run_id: Any,
        wake_at: int | None,
        *,
        alternates: Sequence[tuple[Any, int | None]] = (),
        ahead: int = 0,
        since: float | None = None,
    ) -> Take:
        """
        Claim one due run for a pass, with its run lease, in one commit
        (``store.takes.take_run``): its ``wake_at`` moves to when the
        lease would lapse, guarded by the value read, so another lane that
        read the same value matches nothing; if this one dies, the run is due
        again once its lease is gone. A Django task's step is claimed in the
        same commit (``FirstStep``).

        ``since``: when the look that read these runs began; runs another
        lane of this process is taking, or took since, are left to it
        (``worker.taking``), and those this take means to take (the first,
        and ``ahead`` more) marked as this lane's until it ends.
        """
        candidates = [(run_id, wake_at), *alternates]
        if since is None:
            return self._take(candidates, ahead)
        taking = self.worker.taking
        wake_ats = dict(candidates)
        free = taking.start(list(wake_ats), since, keep=1 + ahead)
        took = Take(False, run_id=run_id)
        try:
            if free:
                took = self._take([(candidate, wake_ats[candidate]) for candidate in free], ahead)
        finally:
            taken = [took.run_id] if took.taken else []
            taking.end(free[: 1 + ahead], [*taken, *(more.run_id for more in took.ahead)])
        return took

    def _take(self, candidates: list[tuple[Any, int | None]], ahead: int) -> Take:
        """``take`` of the first of ``candidates``, or else of the next, in order."""
        (run_id, wake_at), *alternates = candidates
        finishes = self.held.pop()
        args = (self.using, run_id, wake_at, self.holder, conf.LEASE_TTL_MS, RETRY_SOON_MS)
        take = functools.partial(
            take_run, *args, first_step=first_step_of, alternates=alternates, ahead=ahead
        )
        if not finishes:
            return take()
        first = finishes[0].run_id
        try:
            # The lane's last outcomes commit with this take.
            return take(finish=finishes)
        except OUTAGE_ERRORS as error:
            if not is_conflict(error):
                # Lost with the take: their steps run again once their leases lapse.
                raise
            # Rolled back for a conflict every time it was sent: apart, in a commit of their own.
            logger.warning("A take with run %s's outcome met conflicts; writing it alone.", first)
        except DatabaseError:
            logger.exception("A take with run %s's outcome failed; writing the outcome alone.", first)
        write_alone(self.using, finishes)
        return take()

    def drive(
        self,
        run: WorkflowRun,
        *,
        lease: Lease | None = None,
        claimed: dict[str, int] | None = None,
        hold: bool = False,
        steps: list[WorkflowStep] | None = None,
        taken_ahead: bool = False,
    ) -> None:
        """One pass of ``run`` (``drive_run``); ``hold``: its outcome kept for this lane's next take."""
        run_id = run.pk
        keep = functools.partial(self._keep, run) if hold else None
        try:
            run = drive_run(
                run,
                holder=self.holder,
                stop=self.stopping,
                lease=lease,
                claimed=claimed,
                hold=keep,
                steps=steps,
                taken_ahead=taken_ahead,
            )
        except OUTAGE_ERRORS as error:
            if not is_conflict(error):
                # The lane waits the outage out; the run is due again when its lease lapses.
                raise
            # Rolled back for a conflict each time it was sent: no outage,
            # and the lane goes on; the run is due again (at once if its
            # pass gave it back, else when its lease lapses).
            logger.warning("Driving run %s met conflicts each time a write was sent: %s", run_id, error)
            return
        except Exception:
            # One run's failure to be driven must not stop the lane; the run
            # is due again when its lease lapses.
            logger.exception("Driving run %s failed.", run_id)
            return
        if not self.held.holds(run.pk):
            _log_pass(run)

    def _keep(self, run: WorkflowRun, finish: HeldFinish) -> None:
        """Keep ``finish`` for this lane's next take; the pass is logged once its outcome commits."""
        then, alone = finish.then, finish.alone

        def logged(done: bool) -> None:
            then(done)
            _log_pass(run)

        def logged_alone() -> None:
            alone()
            _log_pass(run)

        finish.then, finish.alone = logged, logged_alone
        self.held.add(finish)

    # -- outcomes held ----------------------------------------------------------------

    def flush(self) -> None:
        """Write the outcomes this lane holds, in a commit of their own."""
        write_alone(self.using, self.held.pop())

    def write_stale(self) -> None:
        """Write the outcomes held longer than ``HOLD_WINDOW_S`` (the ``FlushLoop``'s poll)."""
        stale = self.held.pop_older_than(HOLD_WINDOW_S)
        if stale:
            write_alone(self.using, stale)


def _alternates(due: list[tuple[Any, int | None, str]], full: set[str]) -> list[tuple[Any, int | None]]:
    """
    The due runs a take may take instead of the first, in order: up to the
    first of a queue with a limit (whose slot must be held before its take)
    or a queue found full, so that no run is taken ahead of one before it.
    """
    alternates: list[tuple[Any, int | None]] = []
    for run_id, wake_at, queue in due[:ALTERNATES]:
        if queue in full or conf.is_limited(queue):
            break
        alternates.append((run_id, wake_at))
    return alternates


def _log_pass(run: WorkflowRun) -> None:
    logger.info("Run %s (%s): %s", run.pk, run.workflow, run.status)
