"""The worker loop: drives due runs until stopped. ``pikku_worker`` is a thin shell over it."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any

from django.db import DatabaseError, connections

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import LeaseLostError
from pikku_django.leases import default_holder
from pikku_django.managers import ACTIVE_RUN_STATUSES
from pikku_django.models import WorkflowRun
from pikku_django.outages import OUTAGE_ERRORS, Outage
from pikku_django.queues import queue_slot
from pikku_django.workflows.runner import drive_run

logger = logging.getLogger(__name__)


def refresh_connections() -> None:
    """
    Close connections the server dropped or that errors left unusable, as
    Django does around each request, so a long-lived process never works on
    a dead one; keep healthy ones, whatever CONN_MAX_AGE says. A worker is
    not a request: with Django's default CONN_MAX_AGE of 0 it would otherwise
    reconnect (and lose its prepared statements) after every run. Skipped
    while any connection is inside an atomic block (a test case's), which
    closing would break.
    """
    opened = connections.all(initialized_only=True)
    if any(conn.in_atomic_block for conn in opened):
        return
    for conn in opened:
        # close_at is when CONN_MAX_AGE would retire the connection; a worker's never retires.
        conn.close_at = None
        try:
            conn.close_if_unusable_or_obsolete()
        except DatabaseError:
            # Closing a connection the driver already knows dead may raise;
            # Django has let go of it all the same, and the next query reconnects.
            logger.debug("Closing a broken connection raised.", exc_info=True)


class Worker:
    """
    Finds runs that are due on the database clock and drives them, one pass
    each. Many workers on many hosts may run at once: each due run is taken by
    one guarded UPDATE of its ``wake_at`` (so two workers don't both start
    it), and the run lease decides the rest.
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
    ) -> None:
        self.holder = holder or default_holder()
        validate.name("holder", self.holder)
        # The queues this worker drives runs of; None for every queue.
        self.queues = None if queues is None else sorted({validate.queue_name("queues", q) for q in queues})
        self.interval = interval
        self.batch = batch
        self.once = once
        self.max_runs = max_runs
        self.using = using
        self.stopping = threading.Event()
        self.passes = 0
        self.outage = Outage(f"Worker {self.holder}")
        self._signals = 0

    # -- signals --------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """First SIGTERM/SIGINT: finish the step in hand, then exit; second: abort."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.warning("%s: finishing the step in hand, then exiting.", signal.Signals(signum).name)
            self.stopping.set()
            return
        logger.error("%s again: aborting.", signal.Signals(signum).name)
        raise KeyboardInterrupt

    # -- the loop ---------------------------------------------------------------

    def run(self) -> int:
        """Drive runs until stopped (or, with ``once``, until nothing is due); returns passes made."""
        logger.info("Worker %s started.", self.holder)
        while not self.stopping.is_set():
            try:
                took = self.run_batch()
            except OUTAGE_ERRORS as error:
                # The database went away (a restart, a failover): wait it out,
                # never exit. A step in hand was either recorded or is taken
                # again as a new attempt once its lease lapses.
                self.stopping.wait(self.outage.failed(error))
                continue
            self.outage.succeeded()
            if self.max_runs is not None and self.passes >= self.max_runs:
                break
            if not took:
                if self.once:
                    break
                # Wait on the event, not in a blind sleep: a signal wakes us at once.
                self.stopping.wait(self.interval)
        logger.info("Worker %s stopped after %s passes.", self.holder, self.passes)
        return self.passes

    def run_batch(self) -> int:
        """
        Take and drive up to ``batch`` due runs, one at a time, highest priority
        first; returns how many were taken. A queue whose every slot is taken
        (PIKKU_QUEUES) is left out for the rest of the batch, so the worker
        moves on to the runs of other queues instead of waiting on it.
        """
        refresh_connections()
        took = 0
        full: set[str] = set()
        while took < self.batch and not self.stopping.is_set():
            if self.max_runs is not None and self.passes >= self.max_runs:
                break
            if not self.drive_next(full):
                break
            took += 1
            refresh_connections()
        return took

    def drive_next(self, full: set[str]) -> bool:
        """
        Take the first due run no other worker takes first and drive it under a
        slot of its queue; False when nothing is due that this worker may take.
        Looked up afresh before every pass, so a run woken out of turn
        (``wake_at`` 0: its step lost its worker, or the admin woke it) is
        driven next, ahead of a backlog of its priority that only waits its
        turn. A queue found with every slot taken joins ``full`` and is left out.
        """
        while True:
            newly_full = False
            for run_id, wake_at, queue in self.due(exclude=full):
                if queue in full:
                    continue
                outcome = self.take_and_drive(run_id, wake_at, queue)
                if outcome is None:
                    full.add(queue)
                    newly_full = True
                elif outcome:
                    return True
            # Look again only when a queue filled up: its runs may have hidden
            # due runs of other queues from this look.
            if not newly_full:
                return False

    def due(self, exclude: Iterable[str] = ()) -> list[tuple[Any, int | None, str]]:
        """
        Up to ``batch`` due runs of this worker's queues, but not of
        ``exclude``, as (id, wake_at, queue): highest priority first, then the
        earliest ``wake_at`` (the order of the ``pikku_run_due_idx`` index).
        """
        runs = WorkflowRun.objects.db_manager(self.using).get_queryset()
        if self.queues is not None:
            runs = runs.filter(queue__in=self.queues)
        if exclude:
            runs = runs.exclude(queue__in=sorted(exclude))
        return runs.next_due(self.batch)

    def take_and_drive(self, run_id: Any, wake_at: int | None, queue: str) -> bool | None:
        """
        Drive one due run under a slot of its queue: True if it was driven,
        False if another worker took it first, None if every slot of its
        queue is taken (the run stays due).
        """
        try:
            with queue_slot(queue, self.holder, using=self.using) as slot:
                if not slot:
                    return None
                if not self.take(run_id, wake_at):
                    return False
                # Read once, after the take (the due query reads only ids).
                run = WorkflowRun.objects.db_manager(self.using).get_queryset().filter(pk=run_id).first()
                if run is None:
                    return False
                self.drive(run)
                return True
        except LeaseLostError:
            # The pass is over; its step writes were fenced by their own leases.
            logger.warning(
                "Worker %s lost its slot of queue %r while driving run %s.", self.holder, queue, run_id
            )
            return True

    def take(self, run_id: Any, wake_at: int | None) -> bool:
        """
        Claim one due run for a pass: move its ``wake_at`` to when this pass's
        run lease would lapse, guarded by the value read. Another worker that
        read the same value matches nothing; if this one dies, the run is due
        again once its lease is gone.
        """
        runs = WorkflowRun.objects.db_manager(self.using)
        return bool(
            runs.filter(pk=run_id, status__in=ACTIVE_RUN_STATUSES, wake_at=wake_at).update(
                wake_at=DbNowMs() + conf.LEASE_TTL_MS
            )
        )

    def drive(self, run: WorkflowRun) -> None:
        self.passes += 1
        run_id = run.pk
        try:
            run = drive_run(run, holder=self.holder, stop=self.stopping)
        except OUTAGE_ERRORS:
            # The loop waits the outage out; the run is due again when its lease lapses.
            raise
        except Exception:
            # One run's failure to be driven must not stop the worker; the run
            # is due again when its lease lapses.
            logger.exception("Driving run %s failed.", run_id)
            return
        logger.info("Run %s (%s): %s", run.pk, run.workflow, run.status)
