"""The run context a workflow function gets: ``ctx.step()`` runs or replays a step."""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pikku_django import validate
from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    StepFailedError,
    StepSupersededError,
)
from pikku_django.leases import HeldLease
from pikku_django.managers.fence import RunFence
from pikku_django.models import Lease, WorkflowRun, WorkflowScheduleTick, WorkflowStep
from pikku_django.policy import step_policy
from pikku_django.store.passes import HeldFinish
from pikku_django.workflows.attempts import AttemptsMixin, PendingOutcome, step_data
from pikku_django.workflows.attempts import StepLeaseRenewal as StepLeaseRenewal
from pikku_django.workflows.emits import EmitsMixin
from pikku_django.workflows.fanout import FanOutMixin
from pikku_django.workflows.patches import PatchesMixin
from pikku_django.workflows.replay import fitting_rpc_name, step_rpc_name
from pikku_django.workflows.waits import Stop, Suspend, WaitsMixin, commits_held_outcome

logger = logging.getLogger(__name__)

#: How long a run waits before it looks again at a step it could not take and
#: whose state gives no better time (a racing claim, a run held elsewhere).
RETRY_SOON_MS = 1_000


class RunContext(AttemptsMixin, EmitsMixin, FanOutMixin, WaitsMixin, PatchesMixin):
    """
    What a workflow function is called with: ``fn(ctx, input)``. Besides
    ``step``: ``sleep``, ``wait_for_signal`` and ``workflow`` (see ``waits``),
    ``map`` and ``workflows`` (see ``fanout``), ``set_event`` and ``publish``
    (see ``emits``), ``patched`` (see ``patches``). Each attempt of a step
    runs in ``attempts.AttemptsMixin``.
    """

    def __init__(
        self,
        run: WorkflowRun,
        *,
        using: str,
        held: HeldLease | None = None,
        stop: threading.Event | None = None,
        fence: RunFence | None = None,
        claimed: dict[str, int] | None = None,
        steps: list[WorkflowStep] | None = None,
    ) -> None:
        self.run = run
        self.run_id = run.pk
        self.input = run.input
        self._using = using
        self._held = held
        self._stop = stop
        # The run lease every run-level write of this pass is fenced to.
        self._fence = fence
        # The worker's name, written on each attempt it claims (the run lease's holder).
        self.holder = held.lease.holder if held is not None else None
        self._seen: set[str] = set()
        self._signal_waits: dict[str, int] = {}
        self._init_patches()
        # How many set_event / publish calls of each (kind, name) this pass met (``emits``).
        self._emit_counts: dict[tuple[str, str], int] = {}
        # A pass defers a step's success to its next write (see ``flush_outcome``);
        # a context made by hand, outside a pass, writes each outcome at once.
        self._defers = held is not None
        self._pending: PendingOutcome | None = None
        # The flush loop may write a success held too long (``write_held_success``).
        self._pending_lock = threading.Lock()
        self._superseded: WorkflowStep | None = None
        # What to call once the run's outcome has committed, by status (``on_completed``).
        self._ended: dict[str, list[Callable[[WorkflowRun], None]]] = {"completed": [], "failed": []}
        # A lane's keeper of this pass's outcome for its next take (``runner.drive_run``'s ``hold``).
        self.hold: Callable[[HeldFinish], None] | None = None
        # Steps the worker's take claimed in its own commit (name to attempt): the steps in hand.
        self._claimed = dict(claimed or {})
        #: While the attempt of a step the take claimed runs: that step, as
        #: read since its claim (for the claim that reads it back, a task's
        #: ``FirstStep(only=True)``, its ``updated_at`` is the attempt's
        #: ``running_at``).
        self.in_hand: WorkflowStep | None = None
        #: The take that claimed the steps in hand checked the run's state
        #: right before this pass (False for a run taken ahead of others
        #: whose pass starts long after its take).
        self.take_checked = True
        # One read of every step (or every step as the take read them): finished steps replay from here.
        if steps is None:
            steps = WorkflowStep.objects.db_manager(using).of_run(run.pk)
        self._steps = {s.step_name: s for s in steps}

    @commits_held_outcome
    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int | None = None,
        retry_delay: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        backoff: Any = None,
        retry_on: Any = None,
        timeout_ms: int | None = None,
        worker_losses: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """
        Run ``fn(*args, **kwargs)`` as the step ``name``, at least once and its
        result kept: a replay returns the stored result without calling ``fn``.
        The policy options (``max_attempts`` ... ``worker_losses``): ``policy``.
        """
        validate.name("name", name)
        self._policy = step_policy(
            retries=retries,
            max_attempts=max_attempts,
            backoff=backoff,
            retry_on=retry_on,
            timeout_ms=timeout_ms,
            worker_losses=worker_losses,
        )
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be callable, not {type(fn).__name__}.")
        self._use_name(name)
        lease_ms = conf.STEP_LEASE_MS if lease_ms is None else validate.positive_ms("lease_ms", lease_ms)
        step = self._steps.get(name)
        if step is not None:
            # A step met before: the held success commits first, on its own.
            self.flush_outcome()
        else:
            step = self._start_step(name, step_rpc_name(fn), fn, args, kwargs, lease_ms, retries, retry_delay)
        rpc_name = fitting_rpc_name(self.run_id, name, step.rpc_name, fn)
        return self._step_result(step, name, rpc_name, fn, args, kwargs, lease_ms)

    def _start_step(
        self,
        name: str,
        rpc_name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lease_ms: int,
        retries: int | None,
        retry_delay: int | None,
    ) -> WorkflowStep:
        """
        A step met for the first time: started and its first attempt run,
        then the step as that left it; or, when it could not be started, the
        step as another pass started it (if none did, suspend a moment).
        """
        self._check_live()
        self.check_markers(name)
        steps = WorkflowStep.objects.db_manager(self._using)
        # A step run for the first time is inserted already claimed, in
        # one commit with the held success of the step before it (each
        # keeps its own guard; a superseded success starts nothing).
        pending = self.take_outcome()
        try:
            started = steps.start_step(
                self.run_id,
                name,
                rpc_name,
                lease_ms,
                step_data(args, kwargs),
                **self.budget(retries),
                retry_delay=retry_delay,
                holder=self.holder,
                fence=self._fence,
                outcome=None if pending is None else pending.finish,
            )
        except StepSupersededError:
            assert pending is not None
            self._stale(pending.step)
        if started is not None:
            # Its start was guarded by the run's state (active, not past its
            # deadline), so the check after a claim is already made.
            self._execute(started, fn, args, kwargs, lease_ms, checked=True)
            return started if started.status == "succeeded" else steps.get(pk=started.pk)
        # Another pass inserted it after this one read the run's steps, or
        # the run was cancelled, ended or timed out: _check_run says which.
        found = steps.filter(run_id=self.run_id, step_name=name).first()
        if found is None:
            now = self._check_run()
            raise Suspend(now + RETRY_SOON_MS, f"step {name!r} could not be started")
        return found

    def _step_result(
        self,
        step: WorkflowStep,
        name: str,
        rpc_name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lease_ms: int,
    ) -> Any:
        """
        ``step``'s result: replayed once it succeeded, its error raised once
        it failed for good; until then its attempts are run, the one the take
        claimed first, each next one claimed here (or suspend until it can be).
        """
        steps = WorkflowStep.objects.db_manager(self._using)
        while True:
            if step.status == "succeeded":
                return step.result
            if step.status == "failed" and step.is_exhausted:
                raise StepFailedError(name, step.attempt, step.error)
            if self._claimed.pop(name, None) == step.attempt and step.status == "running":
                step = self._run_in_hand(step, fn, args, kwargs, lease_ms)
                continue
            self._check_live()
            self._wait_retry_delay(step)
            # Running under a lapsed lease, not given back by a take: its worker was lost.
            took_over = step.status == "running" and not step.provisional
            attempt = steps.claim_attempt(self.run_id, name, rpc_name, lease_ms, holder=self.holder)
            if attempt is None:
                step = steps.get(pk=step.pk)
                self._wait_for(step)
                continue
            step.attempt, step.status = attempt, "running"
            if took_over:
                self._tell_lost(step)
            self._execute(step, fn, args, kwargs, lease_ms)
            if step.status != "succeeded":
                step = steps.get(pk=step.pk)

    def _run_in_hand(
        self,
        step: WorkflowStep,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lease_ms: int,
    ) -> WorkflowStep:
        """
        Run the attempt the take claimed, ``step`` as read since its claim (the
        step in hand), even when the worker is stopping (as after any claim);
        returns the step as the attempt left it.
        """
        if self._held is not None and self._held.lost.is_set():
            raise Stop("the run lease was lost")
        # The take found the run active under its row lock, in the
        # commit that claimed the step: with no deadline to pass
        # since, that is the check a claim needs (a cancel from now
        # on meets the step's fence, as one during the step does).
        checked = self.take_checked and self.run.deadline_at is None
        if step.attempt > 1 and step.losses and not step.provisional:
            # A take's claim may have taken it from a lost worker.
            self._tell_lost(step)
        self.in_hand = step
        try:
            self._execute(step, fn, args, kwargs, lease_ms, fresh=True, checked=checked)
        finally:
            self.in_hand = None
        if step.status != "succeeded" and not self._holds_failure(step):
            return WorkflowStep.objects.db_manager(self._using).get(pk=step.pk)
        return step

    @property
    def run_lease(self) -> HeldLease | None:
        """The run lease this pass holds (None outside a pass)."""
        return self._held

    @property
    def run_fence(self) -> RunFence | None:
        """The fence of this pass's run-level writes (None outside a pass)."""
        return self._fence

    # -- the pending outcome ---------------------------------------------------------

    def flush_outcome(self) -> None:
        """
        Commit the pending step success on its own, before any other use of
        the store by this pass: then every step that ended before a call is
        recorded before the call writes or decides anything. A superseded
        attempt's outcome is refused, and the pass stops (``Stop``).
        """
        pending = self.take_outcome()
        if pending is not None:
            self._write_outcome(pending.step, pending.finish)

    def take_outcome(self) -> PendingOutcome | None:
        """
        The pending step success, handed to the write that will commit it
        with the run's outcome (``runner``); its step lease is no longer
        renewed. A success the flush loop wrote meanwhile is not handed
        over; one it found superseded stops the pass (``Stop``).
        """
        pending = self.drop_outcome()
        with self._pending_lock:
            superseded, self._superseded = self._superseded, None
        if superseded is not None:
            self._stale(superseded)
        return pending

    def drop_outcome(self) -> PendingOutcome | None:
        """``take_outcome`` that never stops the pass: the end of a pass cut short."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.renewal.stop()
        return pending

    def holds_success(self) -> bool:
        """Does this pass hold a step's success for its next write?"""
        pending = self._pending
        return pending is not None and pending.finish.status == "succeeded"

    def write_held_success(self, older_than_s: float) -> bool:
        """
        Write the step success this pass has held longer than ``older_than_s``
        (the flush loop's, on its own thread and connection), fenced to its
        attempt; the pass learns of a superseded one at its next write. A
        failure held to commit with the run's is left to the pass.
        """
        with self._pending_lock:
            pending = self._pending
            if pending is None or pending.finish.status != "succeeded":
                return False
            if time.monotonic() - pending.since < older_than_s:
                return False
            # Renewed no more: once written, the step is no longer this attempt's to renew.
            pending.renewal.stop()
            try:
                WorkflowStep.objects.db_manager(self._using).write_finish(pending.finish)
            except StepSupersededError:
                self._superseded = pending.step
            except BaseException:
                # Still held (an outage): its lease is renewed again until a write takes it.
                pending.renewal.start()
                raise
            self._pending = None
        return True

    def on_completed(self, callback: Callable[[WorkflowRun], None]) -> None:
        """
        Call ``callback(run)`` once this pass has committed the run's
        completion (never before, and not at all if another pass or a cancel
        decided the run): what reports a result done waits for its commit.
        """
        self._ended["completed"].append(callback)

    def on_failed(self, callback: Callable[[WorkflowRun], None]) -> None:
        """``on_completed`` for the run's failure: called once this pass has committed it."""
        self._ended["failed"].append(callback)

    def completed(self) -> None:
        """The run's completion has committed: tell those who asked (``on_completed``)."""
        self.ended("completed")

    def ended(self, status: str) -> None:
        """The run's outcome ``status`` has committed: call back (``on_completed``, ``on_failed``)."""
        for callback in self._ended.get(status, ()):
            try:
                callback(self.run)
            except Exception:
                logger.exception("A callback on the end of run %s failed.", self.run_id)

    def _holds_failure(self, step: WorkflowStep) -> bool:
        """Does this pass hold ``step``'s failure for its next write (see ``_execute``)?"""
        pending = self._pending
        return pending is not None and pending.step is step and pending.finish.status == "failed"

    def _wait_for(self, step: WorkflowStep) -> None:
        """A step this pass could not claim: replay it, or suspend until it can move."""
        if step.status == "succeeded" or (step.status == "failed" and step.is_exhausted):
            return
        if step.status == "running" and step.lease_expires_at is not None:
            raise Suspend(step.lease_expires_at, f"step {step.step_name!r} is held by another worker")
        if step.status in ("running", "suspended"):
            raise Suspend(None, f"step {step.step_name!r} is parked")
        now = Lease.objects.db_manager(self._using).db_now_ms()
        raise Suspend(now + RETRY_SOON_MS, f"step {step.step_name!r} was not claimable")

    def _check_live(self) -> None:
        """Stop before a new step if this pass lost its run lease or was asked to stop."""
        if self._held is not None and self._held.lost.is_set():
            raise Stop("the run lease was lost")
        if self._stop is not None and self._stop.is_set():
            now = Lease.objects.db_manager(self._using).db_now_ms()
            raise Suspend(now, "the worker is stopping")

    @property
    def scheduled_at(self) -> datetime.datetime | None:
        """
        The instant (an aware UTC ``datetime``) of the schedule tick that
        started this run, or None for a run no schedule started.
        """
        return WorkflowScheduleTick.objects.db_manager(self._using).scheduled_at(self.run.pk)
