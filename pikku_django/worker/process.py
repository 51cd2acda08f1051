"""
The worker: lanes that drive due runs, and beside them the sweep, the
scheduler and (on PostgreSQL) the wake-up listener, each a ``Poller``.
``pikku_worker`` is a thin shell over ``Worker``.
"""

from __future__ import annotations

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
from pikku_django.errors import (
    DatabaseUnavailableError,
    InvalidArgumentError,
    WorkerAbortedError,
    WorkerNameTakenError,
)
from pikku_django.leases import default_holder
from pikku_django.managers.base import write_alias
from pikku_django.managers.run_queries import WorkflowRunQuerySet
from pikku_django.models import WorkflowRun
from pikku_django.outages import ONCE_GIVES_UP_AFTER_S, OUTAGE_ERRORS, Outage, raise_if_not_migrated
from pikku_django.schedules import tick
from pikku_django.sql.cursors import hot_cursor
from pikku_django.sql.names import NameLock
from pikku_django.sql.notify import carries_notifications, looks_for_lanes
from pikku_django.store import fairness
from pikku_django.worker.beat import BeatLoop
from pikku_django.worker.lane import Lane
from pikku_django.worker.listener import Listener
from pikku_django.worker.loops import FlushLoop, NameLoop, SchedulerLoop, SweepLoop
from pikku_django.worker.poller import Poller
from pikku_django.worker.taking import Taking
from pikku_django.worker.watchers import LANE_FALLBACK_S, watchers

logger = logging.getLogger(__name__)

__all__ = ["Worker"]


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
        self._count = threading.Lock()
        self._due_statements: dict[int, tuple[str, tuple[Any, ...]]] = {}
        #: The due runs its lanes are taking, which each leaves to the others.
        self.taking = Taking()
        self._signals = 0
        # The lock on this worker's name, once taken (``run``).
        self.name_lock: NameLock | None = None
        self.lanes = [Lane(self, index) for index in range(self.concurrency)]

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
        What runs beside the lanes: the lock on its name, its heartbeat
        (``beat.BeatLoop``, for the admin's Workers page), the writer of
        outcomes held too long, the sweep, the scheduler, and what wakes
        them on other processes' commits (the listener on PostgreSQL, else
        the ``watchers`` loops).
        """
        beside: list[Poller] = []
        if not self.once and self.name_lock is not None:
            beside.append(NameLoop(self, self.name_lock))
        if not self.once:
            beside.append(BeatLoop(self))
        beside.append(FlushLoop(self))
        if self.sweep_interval is not None:
            beside.append(SweepLoop(self))
        if self.schedules and not self.once:
            beside.append(SchedulerLoop(self))
        if not self.once:
            if carries_notifications(self.using):
                beside.append(Listener(self.using, stop=self.stopping))
            beside.extend(watchers(self))
        return beside

    def run(self) -> int:
        """
        Drive runs until stopped (or, with ``once``, until nothing is due);
        returns passes made. A database out of reach at the start is waited
        for like any outage; one that is not migrated is an error at once.
        """
        self.thread = threading.current_thread()
        with ExitStack() as stack:
            if self._take_name(stack):
                self._run()
        return self.passes

    def _take_name(self, stack: ExitStack) -> bool:
        """
        The lock on this worker's name (``sql.names``): a second live
        worker under it would share every lease with this one, so it refuses
        to start. False if the worker was stopped while it waited for the
        database.
        """
        outage = Outage(f"Worker {self.holder}")
        lock = NameLock(self.using, self.holder)
        while True:
            try:
                taken = lock.acquire()
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
            if not taken:
                raise WorkerNameTakenError(self.holder)
            outage.succeeded()
            stack.callback(lock.release)
            self.name_lock = lock
            return True

    def _run(self) -> None:
        logger.info("Worker %s started with %s lane(s).", self.holder, self.concurrency)
        lanes = self.lanes
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

    def reserve(self) -> bool:
        """Count one more pass, unless ``max_runs`` are made; False then."""
        with self._count:
            if self.spent():
                return False
            self.passes += 1
            return True

    def unreserve(self) -> None:
        """Take back a pass ``reserve`` counted that took no run."""
        with self._count:
            self.passes -= 1

    # -- a lane's work, from the calling thread --------------------------------------

    def drive_next(self, full: set[str] | None = None, *, hold: bool = False) -> bool:
        """The first lane's ``Lane.drive_next``, in the calling thread."""
        return self.lanes[0].drive_next(full, hold=hold)

    def run_batch(self) -> int:
        """The first lane's ``Lane.run_batch``, in the calling thread: how many runs it drove."""
        return self.lanes[0].run_batch()

    # -- the due look -----------------------------------------------------------------

    def due(
        self, exclude: Iterable[str] = (), *, limit: int | None = None
    ) -> list[tuple[Any, int | None, str]]:
        """
        Up to ``limit`` due runs of this worker's queues, but not of
        ``exclude`` nor of a paused queue (left out in the look's own
        statement, and the take is guarded on it), as (id, wake_at, queue): highest priority first, then the
        earliest ``wake_at`` (the order of the ``pikku_run_due_idx`` index).
        By default ``batch``, and as many more as this process's lanes are
        taking now (``taking``: a lane leaves those to them). The runs of a
        queue with ``per_key`` are put in fair order among its keys
        (``store.fairness.fair_due``: one more statement, only then).
        """
        limit = self.batch + self.taking.busy() if limit is None else limit
        if exclude:
            return fairness.fair_due(self.using, self._runs(exclude).next_due(limit))
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
        # A queue with per_key: its runs in fair order among its keys.
        return fairness.fair_due(
            self.using, [(to_python(pk), wake_at, queue) for pk, wake_at, queue, _ in rows]
        )

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
