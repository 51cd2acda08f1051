"""
The worker: lanes that drive due runs, and beside them the sweep, the
scheduler and (on PostgreSQL) the wake-up listener, each a ``Poller``.
``pikku_worker`` is a thin shell over ``Worker``.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from types import FrameType
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet

from pikku_django import validate, wakeups
from pikku_django.conf import conf
from pikku_django.errors import (
    DatabaseUnavailableError,
    InvalidArgumentError,
    LeaseLostError,
    LeaseTakenError,
    WorkerAbortedError,
    WorkerNameTakenError,
)
from pikku_django.leases import default_holder, hold_lease
from pikku_django.loops import Poller, refresh_connections
from pikku_django.managers.base import write_alias
from pikku_django.managers.passes import HeldFinish, Take, take_run
from pikku_django.managers.runs import WorkflowRunQuerySet
from pikku_django.managers.wakeups import Listener, carries_notifications
from pikku_django.models import Lease, WorkflowRun
from pikku_django.outages import ONCE_GIVES_UP_AFTER_S, OUTAGE_ERRORS, Outage, raise_if_not_migrated
from pikku_django.queues import queue_slot
from pikku_django.schedules import tick
from pikku_django.watchers import LANE_FALLBACK_S, looks_for_lanes, watcher
from pikku_django.worker_loops import Lane, SchedulerLoop, SweepLoop
from pikku_django.workflows.context import RETRY_SOON_MS
from pikku_django.workflows.registry import first_step_of
from pikku_django.workflows.runner import drive_run

logger = logging.getLogger(__name__)

__all__ = ["Lane", "Worker", "WorkerNameTakenError", "refresh_connections"]

#: The lease that makes a worker's name its own while it runs.
WORKER_LEASE_PREFIX = "worker:"


class Worker:
    """
    Finds runs that are due on the database clock and drives them, one pass
    each, on ``concurrency`` lanes. Many workers on many hosts may run at
    once: each due run is taken by one guarded UPDATE of its ``wake_at`` (so
    two lanes don't both start it), and the run lease decides the rest.
    With one lane and nothing else to run, the lane runs in the calling thread.
    """

    def __init__(
        self,
        *,
        holder: str | None = None,
        interval: float = 1.0,
        batch: int = 10,
        once: bool = False,
        max_runs: int | None = None,
        using: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        sweep_interval: float | None = None,
        schedules: bool = False,
    ) -> None:
        self.holder = holder or default_holder()
        validate.name("holder", self.holder)
        # The queues this worker drives runs of; None for every queue.
        self.queues = None if queues is None else sorted({validate.queue_name("queues", q) for q in queues})
        self.concurrency = validate.whole("concurrency", concurrency, minimum=1)
        if sweep_interval is not None and not sweep_interval > 0:
            raise InvalidArgumentError(f"sweep_interval must be positive, not {sweep_interval!r}.")
        self.interval = interval
        self.batch = batch
        self.once = once
        self.max_runs = max_runs
        # Every read here decides a write: the router's write database.
        self.using = write_alias(WorkflowRun, using)
        # --once drives what is due and exits: no sweep or listener beside it,
        # and one scheduler pass before its lanes look.
        self.sweep_interval = None if once else sweep_interval
        self.schedules = schedules
        self.stopping = threading.Event()
        self.passes = 0
        self.thread: threading.Thread | None = None
        self.lanes: list[Lane] = []
        self._count = threading.Lock()
        self._due_statements: dict[int, tuple[str, tuple[Any, ...]]] = {}
        # Each lane's outcome kept for its next take, by lane holder (``drive_next``'s ``hold``).
        self._held: dict[str, HeldFinish] = {}
        self._signals = 0

    def lane_interval(self) -> float:
        """
        Seconds between an idle lane's own looks: ``interval``, or where one
        look of the process looks for every lane (``watchers.DueLook``, while
        it runs), ``LANE_FALLBACK_S`` if that is longer.
        """
        if self.once or not looks_for_lanes(self.using):
            return self.interval
        return max(self.interval, LANE_FALLBACK_S)

    def lane_holder(self, index: int) -> str:
        """
        The holder name of lane ``index``: the worker's own for the first
        lane, ``name/N`` for lane N after it, so each lane's leases are its own.
        """
        if index == 0:
            return self.holder
        suffix = f"/{index + 1}"
        return self.holder[: validate.MAX_NAME_LENGTH - len(suffix)] + suffix

    # -- signals --------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """First SIGTERM/SIGINT: every lane finishes its step in hand, then exit; second: abort."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.warning("%s: finishing the step in hand, then exiting.", signal.Signals(signum).name)
            self.stop()
            return
        logger.error("%s again: aborting.", signal.Signals(signum).name)
        raise WorkerAbortedError

    def stop(self) -> None:
        """Ask every loop to end after the unit in hand (safe more than once)."""
        self.stopping.set()
        wakeups.notify()

    # -- the loops ----------------------------------------------------------------

    def loops(self) -> list[Poller]:
        """
        What runs beside the lanes: the sweep, the scheduler, and what wakes
        them on other processes' commits (the listener on PostgreSQL, else a
        ``watchers`` loop).
        """
        beside: list[Poller] = []
        if self.sweep_interval is not None:
            beside.append(SweepLoop(self))
        if self.schedules and not self.once:
            beside.append(SchedulerLoop(self))
        if not self.once:
            if carries_notifications(self.using):
                beside.append(Listener(self.using, stop=self.stopping))
            woken_by = watcher(self)
            if woken_by is not None:
                beside.append(woken_by)
        return beside

    def run(self) -> int:
        """
        Drive runs until stopped (or, with ``once``, until nothing is due);
        returns passes made. A database out of reach at the start is waited
        for like any outage; one that is not migrated is an error at once.
        """
        self.thread = threading.current_thread()
        try:
            with ExitStack() as stack:
                if self._take_name(stack):
                    self._run()
        except LeaseLostError:
            logger.warning("Worker %s lost the lease on its name.", self.holder)
        return self.passes

    def _take_name(self, stack: ExitStack) -> bool:
        """
        The lease on this worker's name (``worker:NAME``): a second live worker
        under it would share every lease with this one, so it refuses to start.
        False if the worker was stopped while it waited for the database.
        """
        outage = Outage(f"Worker {self.holder}")
        while True:
            lease = hold_lease(WORKER_LEASE_PREFIX + self.holder, holder=default_holder(), using=self.using)
            try:
                lease.__enter__()
            except LeaseTakenError:
                raise WorkerNameTakenError(self.holder) from None
            except OUTAGE_ERRORS as error:
                raise_if_not_migrated(error)
                delay = outage.failed(error)
                if self.once and outage.lasted >= ONCE_GIVES_UP_AFTER_S:
                    raise DatabaseUnavailableError(outage.lasted, error) from error
                if self.stopping.wait(delay):
                    return False
                continue
            except DatabaseError as error:
                raise_if_not_migrated(error)
                raise
            outage.succeeded()
            stack.push(lease)
            return True

    def _run(self) -> None:
        logger.info("Worker %s started with %s lane(s).", self.holder, self.concurrency)
        lanes = self.lanes = [Lane(self, index) for index in range(self.concurrency)]
        if self.once and self.schedules:
            # The ticks due now start their runs before the lanes look.
            try:
                tick(using=self.using)
            except DatabaseError as error:
                raise_if_not_migrated(error)
                if not isinstance(error, OUTAGE_ERRORS):
                    raise
                logger.warning(
                    "Worker %s: no scheduler pass, the database is unavailable (%s).", self.holder, error
                )
        beside = self.loops()
        try:
            for loop in beside:
                loop.start()
            if len(lanes) == 1:
                lanes[0].run()
            else:
                for lane in lanes:
                    lane.start()
                # Joined in short waits: signals are handled on this thread.
                while any(not lane.join(0.2) for lane in lanes):
                    if any(lane.error is not None for lane in lanes):
                        self.stop()
        finally:
            self.stop()
            for loop in beside:
                loop.join(10)
        failed = next((lane.error for lane in lanes if lane.error is not None), None)
        if failed is not None:
            raise failed
        logger.info("Worker %s stopped after %s passes.", self.holder, self.passes)

    def spent(self) -> bool:
        """True once ``max_runs`` passes have been made."""
        return self.max_runs is not None and self.passes >= self.max_runs

    def _reserve(self) -> bool:
        with self._count:
            if self.spent():
                return False
            self.passes += 1
            return True

    def _unreserve(self) -> None:
        with self._count:
            self.passes -= 1

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
        while not self.stopping.is_set():
            newly_full = False
            due = self.due(exclude=full)
            if len(due) > 1:
                # More is due than this lane takes: wake one more idle lane
                # for the next (which does the same), so a burst fans out.
                wakeups.nudge()
            for run_id, wake_at, queue in due:
                if queue in full:
                    continue
                if not self._reserve():
                    return False
                outcome = self.take_and_drive(run_id, wake_at, queue, holder, hold=hold)
                if outcome:
                    return True
                self._unreserve()
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
        try:
            while took < self.batch and not self.stopping.is_set() and self.drive_next(full=full, hold=True):
                took += 1
                refresh_connections()
        finally:
            self.flush(holder)
        return took

    def due(
        self, exclude: Iterable[str] = (), *, limit: int | None = None
    ) -> list[tuple[Any, int | None, str]]:
        """
        Up to ``limit`` (``batch``) due runs of this worker's queues, but not of
        ``exclude``, as (id, wake_at, queue): highest priority first, then the
        earliest ``wake_at`` (the order of the ``pikku_run_due_idx`` index).
        """
        limit = self.batch if limit is None else limit
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
        with connections[self.using].cursor() as cursor:
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
        """Write the outcome ``holder``'s lane holds (see ``drive_next``), in a commit of its own."""
        finish = self._held.pop(holder, None)
        if finish is not None:
            finish.alone()

    def take_and_drive(
        self, run_id: Any, wake_at: int | None, queue: str, holder: str | None = None, *, hold: bool = False
    ) -> bool | None:
        """
        Drive one due run under a slot of its queue: True if it was driven,
        False if another lane took it first, None if every slot of its
        queue is taken (the run stays due).
        """
        holder = holder or self.lane_holder(0)
        try:
            with queue_slot(queue, holder, using=self.using) as slot:
                if not slot:
                    return None
                took = self.take(run_id, wake_at, holder)
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
                self.drive(took.run, holder, lease=took.lease, claimed=took.claimed, hold=keeps)
                return True
        except LeaseLostError:
            # The pass is over; its writes were fenced by their own leases.
            logger.warning("%s lost its slot of queue %r while driving run %s.", holder, queue, run_id)
            return True

    def take(self, run_id: Any, wake_at: int | None, holder: str | None = None) -> Take:
        """
        Claim one due run for a pass, with its run lease, in one commit
        (``managers.passes.take_run``): its ``wake_at`` moves to when the
        lease would lapse, guarded by the value read, so another lane that
        read the same value matches nothing; if this one dies, the run is due
        again once its lease is gone. A Django task's step is claimed in the
        same commit (``FirstStep``).
        """
        holder = holder or self.lane_holder(0)
        finish = self._held.pop(holder, None)
        args = (self.using, run_id, wake_at, holder, conf.LEASE_TTL_MS, RETRY_SOON_MS)
        if finish is None:
            return take_run(*args, first_step=first_step_of)
        try:
            # The lane's last outcome commits with this take.
            return take_run(*args, first_step=first_step_of, finish=finish)
        except OUTAGE_ERRORS:
            # Lost with the take: its step runs again once its leases lapse.
            raise
        except DatabaseError:
            logger.exception("A take with run %s's outcome failed; writing the outcome alone.", finish.run_id)
            finish.alone()
            return take_run(*args, first_step=first_step_of)

    def drive(
        self,
        run: WorkflowRun,
        holder: str | None = None,
        *,
        lease: Lease | None = None,
        claimed: dict[str, int] | None = None,
        hold: bool = False,
    ) -> None:
        run_id = run.pk
        holder = holder or self.lane_holder(0)
        keep = functools.partial(self._keep, holder, run) if hold else None
        try:
            run = drive_run(run, holder=holder, stop=self.stopping, lease=lease, claimed=claimed, hold=keep)
        except OUTAGE_ERRORS:
            # The lane waits the outage out; the run is due again when its lease lapses.
            raise
        except Exception:
            # One run's failure to be driven must not stop the lane; the run
            # is due again when its lease lapses.
            logger.exception("Driving run %s failed.", run_id)
            return
        held = self._held.get(holder)
        if held is None or held.run_id != run.pk:
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
        self._held[holder] = finish


def _log_pass(run: WorkflowRun) -> None:
    logger.info("Run %s (%s): %s", run.pk, run.workflow, run.status)
