"""
A worker's passes: look for due runs, take one (with its run lease, and a
task's step, in one commit), drive it under a slot of its queue, and hold
its outcome for the lane's next take (``managers.passes``). ``Worker``
mixes them in; its loops call ``drive_next``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet

from pikku_django import wakeups
from pikku_django.conf import conf
from pikku_django.errors import LeaseLostError
from pikku_django.held import HOLD_WINDOW_S, HeldOutcomes
from pikku_django.loops import refresh_connections
from pikku_django.managers.base import hot_cursor
from pikku_django.managers.conflicts import is_conflict
from pikku_django.managers.passes import HeldFinish, write_held
from pikku_django.managers.runs import WorkflowRunQuerySet
from pikku_django.managers.takes import Take, take_run
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.queues import queue_slot
from pikku_django.taking import Taking
from pikku_django.worker_ahead import AheadPasses
from pikku_django.workflows.context import RETRY_SOON_MS
from pikku_django.workflows.registry import first_step_of
from pikku_django.workflows.runner import drive_run

logger = logging.getLogger("pikku_django.worker")


class WorkerPasses(AheadPasses):
    """``Worker``'s passes (see the module docstring)."""

    using: str
    batch: int
    concurrency: int
    max_runs: int | None
    passes: int
    queues: list[str] | None
    stopping: threading.Event
    _held: HeldOutcomes
    _taking: Taking
    _due_statements: dict[int, tuple[str, tuple[Any, ...]]]

    def lane_holder(self, index: int) -> str:
        raise NotImplementedError

    def _reserve(self) -> bool:
        raise NotImplementedError

    def _unreserve(self) -> None:
        raise NotImplementedError

    # -- one pass -------------------------------------------------------------------

    def drive_next(
        self, holder: str | None = None, full: set[str] | None = None, *, hold: bool = False
    ) -> bool:
        """
        Take the first due run no other lane takes first and drive it under a
        slot of its queue; False when nothing is due that this lane may take.
        Looked up afresh before every pass, so a run woken out of turn
        (``wake_at`` 0: its step lost its worker, or the admin woke it) is
        driven next, ahead of a backlog of its priority that only waits its
        turn. A queue found with every slot taken joins ``full`` and is left out.

        ``hold``: the outcome of a run with no parent and no queue limit is
        kept for this lane's next take, which commits it (one commit per run
        for a lane going from run to run); ``flush`` writes it otherwise, and
        this does when nothing is taken.
        """
        holder = holder or self.lane_holder(0)
        full = set() if full is None else full
        try:
            took = self._drive_next(holder, full, hold)
        except BaseException:
            try:
                self.flush(holder)
            except Exception:
                # Lost: its step runs again once its leases lapse.
                logger.warning("%s could not write the outcome it held.", holder, exc_info=True)
            raise
        if not took:
            self.flush(holder)
        return took

    def _drive_next(self, holder: str, full: set[str], hold: bool) -> bool:
        looks = 0
        while not self.stopping.is_set():
            newly_full = False
            looks += 1
            since = time.monotonic()
            # Past the runs other lanes of this process are taking, which it leaves to them.
            looked = self.due(exclude=full)
            due = self._taking.claim(looked, since)
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
                if not self._reserve():
                    return False
                alternates = _alternates(due[index + 1 :], full) if conf.concurrency(queue) is None else []
                ahead = self._ahead(holder, len(looked)) if hold and alternates else 0
                outcome = self.take_and_drive(
                    run_id, wake_at, queue, holder, hold=hold, alternates=alternates, ahead=ahead, since=since
                )
                if outcome:
                    return True
                self._unreserve()
                tried.update(other for other, _ in alternates)
                if outcome is None:
                    full.add(queue)
                    newly_full = True
            # Look again only when a queue filled up: its runs may have hidden
            # due runs of other queues from this look.
            if not newly_full:
                return False
        return False

    def run_batch(self) -> int:
        """Drive up to ``batch`` due runs one after another in this thread; returns how many."""
        took = 0
        full: set[str] = set()
        holder = self.lane_holder(0)
        start = self.passes
        try:
            while took < self.batch and not self.stopping.is_set():
                # A take may take runs ahead (``_ahead``), but no more than the batch has room for.
                self._room = self.batch - took
                if not self.drive_next(full=full, hold=True):
                    break
                took = self.passes - start
                refresh_connections()
        finally:
            self._room = None
            self.flush(holder)
        return took

    def due(
        self, exclude: Iterable[str] = (), *, limit: int | None = None
    ) -> list[tuple[Any, int | None, str]]:
        """
        Up to ``limit`` due runs of this worker's queues, but not of
        ``exclude``, as (id, wake_at, queue): highest priority first, then the
        earliest ``wake_at`` (the order of the ``pikku_run_due_idx`` index).
        By default ``batch``, and as many more as this process's lanes are
        taking now (``taking``: a lane leaves those to them).
        """
        limit = self.batch + self._taking.busy() if limit is None else limit
        if exclude:
            return self._runs(exclude).next_due(limit)
        # The usual look (no queue left out) is compiled once per limit:
        # building the query costs several times what running it does, and it
        # stands between a wake-up and the take. Its "now" is the database's,
        # in the SQL, never a parameter.
        statement = self._due_statements.get(limit)
        if statement is None:
            sql, params = self.due_rows(limit).query.get_compiler(using=self.using).as_sql()
            statement = self._due_statements[limit] = (sql, tuple(params))
        # Prepared on PostgreSQL, as the pass's statements are: planning it
        # costs the server more than running it.
        with hot_cursor(connections[self.using]) as cursor:
            cursor.execute(*statement)
            rows = cursor.fetchall()
        to_python = WorkflowRun._meta.pk.to_python
        return [(to_python(pk), wake_at, queue) for pk, wake_at, queue, _ in rows]

    def due_rows(self, limit: int) -> QuerySet[Any, Any]:
        """``due(limit=limit)`` as a query not yet run (``WorkflowRunQuerySet.next_due_rows``)."""
        return self._runs(()).next_due_rows(limit)

    def _runs(self, exclude: Iterable[str]) -> WorkflowRunQuerySet:
        runs = WorkflowRun.objects.db_manager(self.using).get_queryset()
        if self.queues is not None:
            runs = runs.filter(queue__in=self.queues)
        if exclude:
            runs = runs.exclude(queue__in=sorted(exclude))
        return runs

    def flush(self, holder: str) -> None:
        """Write the outcomes ``holder``'s lane holds (see ``drive_next``), in a commit of their own."""
        self._write_alone(self._held.pop(holder))

    def write_stale(self) -> None:
        """Write the outcomes held longer than ``HOLD_WINDOW_S`` (the ``FlushLoop``'s poll)."""
        for finishes in self._held.older_than(HOLD_WINDOW_S):
            self._write_alone(finishes)

    def _write_alone(self, finishes: list[HeldFinish]) -> None:
        """Held outcomes in one commit of their own, or, if that fails, each in its own."""
        if len(finishes) > 1:
            try:
                write_held(self.using, finishes)
                return
            except OUTAGE_ERRORS as error:
                if not is_conflict(error):
                    # Lost: their steps run again once their leases lapse.
                    raise
                logger.warning(
                    "Writing %s held outcomes together met conflicts; writing each alone.", len(finishes)
                )
            except DatabaseError:
                logger.exception(
                    "Writing %s held outcomes together failed; writing each alone.", len(finishes)
                )
        for finish in finishes:
            finish.alone()

    def take_and_drive(
        self,
        run_id: Any,
        wake_at: int | None,
        queue: str,
        holder: str | None = None,
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
        if this one is not (``managers.takes.take_run``); ``ahead``: how
        many of them may be taken too, and driven after it (``_drive_ahead``);
        ``since``: when the look that found them began (``take``).
        """
        holder = holder or self.lane_holder(0)
        try:
            with queue_slot(queue, holder, using=self.using) as slot:
                if not slot:
                    return None
                took = self.take(run_id, wake_at, holder, alternates=alternates, ahead=ahead, since=since)
                if took.ahead:
                    # Only ever with alternates: of queues with no limit, like this one.
                    self._drive_ahead(took, holder, hold)
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
                keeps = hold and conf.concurrency(queue) is None
                self._timed_drive(took, holder, keeps)
                return True
        except LeaseLostError:
            # The pass is over; its writes were fenced by their own leases.
            logger.warning("%s lost its slot of queue %r while driving run %s.", holder, queue, run_id)
            return True

    def take(
        self,
        run_id: Any,
        wake_at: int | None,
        holder: str | None = None,
        *,
        alternates: Sequence[tuple[Any, int | None]] = (),
        ahead: int = 0,
        since: float | None = None,
    ) -> Take:
        """
        Claim one due run for a pass, with its run lease, in one commit
        (``managers.takes.take_run``): its ``wake_at`` moves to when the
        lease would lapse, guarded by the value read, so another lane that
        read the same value matches nothing; if this one dies, the run is due
        again once its lease is gone. A Django task's step is claimed in the
        same commit (``FirstStep``).

        ``since``: when the look that read these runs began; runs another
        lane of this process is taking, or took since, are left to it
        (``taking``), and those this take means to take (the first, and
        ``ahead`` more) marked as this lane's until it ends.
        """
        holder = holder or self.lane_holder(0)
        candidates = [(run_id, wake_at), *alternates]
        if since is None:
            return self._take(candidates, holder, ahead)
        wake_ats = dict(candidates)
        free = self._taking.start(list(wake_ats), since, keep=1 + ahead)
        took = Take(False, run_id=run_id)
        try:
            if free:
                took = self._take([(candidate, wake_ats[candidate]) for candidate in free], holder, ahead)
        finally:
            taken = [took.run_id] if took.taken else []
            self._taking.end(free[: 1 + ahead], [*taken, *(more.run_id for more in took.ahead)])
        return took

    def _take(self, candidates: list[tuple[Any, int | None]], holder: str, ahead: int) -> Take:
        """``take`` of the first of ``candidates``, or else of the next, in order."""
        (run_id, wake_at), *alternates = candidates
        finishes = self._held.pop(holder)
        args = (self.using, run_id, wake_at, holder, conf.LEASE_TTL_MS, RETRY_SOON_MS)
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
        self._write_alone(finishes)
        return take()

    def drive(
        self,
        run: WorkflowRun,
        holder: str | None = None,
        *,
        lease: Lease | None = None,
        claimed: dict[str, int] | None = None,
        hold: bool = False,
        steps: list[WorkflowStep] | None = None,
        taken_ahead: bool = False,
    ) -> None:
        run_id = run.pk
        holder = holder or self.lane_holder(0)
        keep = functools.partial(self._keep, holder, run) if hold else None
        try:
            run = drive_run(
                run,
                holder=holder,
                stop=self.stopping,
                lease=lease,
                claimed=claimed,
                hold=keep,
                steps=steps,
                taken_ahead=taken_ahead,
            )
        except OUTAGE_ERRORS:
            # The lane waits the outage out; the run is due again when its lease lapses.
            raise
        except Exception:
            # One run's failure to be driven must not stop the lane; the run
            # is due again when its lease lapses.
            logger.exception("Driving run %s failed.", run_id)
            return
        if not self._held.holds(holder, run.pk):
            _log_pass(run)

    def _keep(self, holder: str, run: WorkflowRun, finish: HeldFinish) -> None:
        """Keep ``finish`` for ``holder``'s next take; the pass is logged once its outcome commits."""
        then, alone = finish.then, finish.alone

        def logged(done: bool) -> None:
            then(done)
            _log_pass(run)

        def logged_alone() -> None:
            alone()
            _log_pass(run)

        finish.then, finish.alone = logged, logged_alone
        self._held.add(holder, finish)


#: How many due runs after the first a take may fall back on in its commit.
ALTERNATES = 8
#: How many looks a lane makes in one ``drive_next`` while every run each
#: finds is another lane's.
LOOKS = 3


def _alternates(due: list[tuple[Any, int | None, str]], full: set[str]) -> list[tuple[Any, int | None]]:
    """
    The due runs a take may take instead of the first, in order: up to the
    first of a queue with a limit (whose slot must be held before its take)
    or a queue found full, so that no run is taken ahead of one before it.
    """
    alternates: list[tuple[Any, int | None]] = []
    for run_id, wake_at, queue in due[:ALTERNATES]:
        if queue in full or conf.concurrency(queue) is not None:
            break
        alternates.append((run_id, wake_at))
    return alternates


def _log_pass(run: WorkflowRun) -> None:
    logger.info("Run %s (%s): %s", run.pk, run.workflow, run.status)
