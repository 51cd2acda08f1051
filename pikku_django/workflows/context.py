"""The run context a workflow function gets: ``ctx.step()`` runs or replays a step."""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from pikku_django import validate
from pikku_django.clock import DbNowMs, EpochMs
from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    StepFailedError,
    StepFunctionMismatchError,
    StepSupersededError,
)
from pikku_django.leases import HeldLease
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.managers.fence import RunFence
from pikku_django.managers.passes import HeldFinish
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.workflows.attempts import (
    PendingOutcome,
    StepLeaseRenewal,
    spends_budget,
    step_data,
    wait_for_awaitable,
)
from pikku_django.workflows.current import StepHandle, running_step
from pikku_django.workflows.fanout import FanOutMixin
from pikku_django.workflows.registry import dotted_name
from pikku_django.workflows.waits import PASS_CONTROL, Stop, Suspend, WaitsMixin, commits_held_outcome

logger = logging.getLogger(__name__)

#: How long a run waits before it looks again at a step it could not take and
#: whose state gives no better time (a racing claim, a run held elsewhere).
RETRY_SOON_MS = 1_000


class RunContext(FanOutMixin, WaitsMixin):
    """
    What a workflow function is called with: ``fn(ctx, input)``. Besides
    ``step``: ``sleep``, ``wait_for_signal`` and ``workflow`` (see ``waits``),
    ``map`` and ``workflows`` (see ``fanout``).
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
        # A pass defers a step's success to its next write (see ``flush_outcome``);
        # a context made by hand, outside a pass, writes each outcome at once.
        self._defers = held is not None
        self._pending: PendingOutcome | None = None
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
        **kwargs: Any,
    ) -> Any:
        """
        Run ``fn(*args, **kwargs)`` as the step ``name``, at least once and its
        result kept: a replay returns the stored result without calling ``fn``.
        """
        validate.name("name", name)
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be callable, not {type(fn).__name__}.")
        if name in self._seen:
            raise InvalidArgumentError(
                f"name: step {name!r} is used twice in workflow {self.run.workflow!r}; "
                "each step of a run needs a name of its own."
            )
        self._seen.add(name)
        lease_ms = conf.STEP_LEASE_MS if lease_ms is None else validate.positive_ms("lease_ms", lease_ms)
        rpc_name = dotted_name(fn)
        steps = WorkflowStep.objects.db_manager(self._using)

        step = self._steps.get(name)
        if step is not None:
            # A step met before: the held success commits first, on its own.
            self.flush_outcome()
        else:
            self._check_live()
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
                    retries=retries,
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
                step = started if started.status == "succeeded" else steps.get(pk=started.pk)
            else:
                # Another pass inserted it after this one read the run's steps, or
                # the run was cancelled, ended or timed out: _check_run says which.
                found = steps.filter(run_id=self.run_id, step_name=name).first()
                if found is None:
                    now = self._check_run()
                    raise Suspend(now + RETRY_SOON_MS, f"step {name!r} could not be started")
                step = found
        if step.rpc_name != rpc_name:
            raise StepFunctionMismatchError(self.run_id, name, step.rpc_name, rpc_name)

        while True:
            if step.status == "succeeded":
                return step.result
            if step.status == "failed" and step.is_exhausted:
                raise StepFailedError(name, step.attempt, step.error)
            if self._claimed.pop(name, None) == step.attempt and step.status == "running":
                # Claimed by the take, and read since: the step in hand, run
                # even when the worker is stopping (as after any claim).
                if self._held is not None and self._held.lost.is_set():
                    raise Stop("the run lease was lost")
                # The take found the run active under its row lock, in the
                # commit that claimed the step: with no deadline to pass
                # since, that is the check a claim needs (a cancel from now
                # on meets the step's fence, as one during the step does).
                checked = self.take_checked and self.run.deadline_at is None
                self.in_hand = step
                try:
                    self._execute(step, fn, args, kwargs, lease_ms, fresh=True, checked=checked)
                finally:
                    self.in_hand = None
                if step.status != "succeeded" and not self._holds_failure(step):
                    step = steps.get(pk=step.pk)
                continue
            self._check_live()
            if step.status == "failed" and step.retry_delay:
                # Judged in epoch ms on the database clock, never from a
                # naive datetime (USE_TZ = False).
                failed_ms, now = (
                    steps.filter(pk=step.pk)
                    .annotate(failed_ms=EpochMs("updated_at"), now=DbNowMs())
                    .values_list("failed_ms", "now")
                    .get()
                )
                due = int(failed_ms) + step.retry_delay
                if now < due:
                    raise Suspend(due, f"step {name!r} waits {step.retry_delay} ms to retry")
            attempt = steps.claim_attempt(self.run_id, name, rpc_name, lease_ms, holder=self.holder)
            if attempt is None:
                step = steps.get(pk=step.pk)
                self._wait_for(step)
                continue
            step.attempt, step.status = attempt, "running"
            self._execute(step, fn, args, kwargs, lease_ms)
            if step.status != "succeeded":
                step = steps.get(pk=step.pk)

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
        with the run's outcome (``runner``); its step lease is no longer renewed.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.renewal.stop()
        return pending

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

    def _execute(
        self,
        step: WorkflowStep,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lease_ms: int,
        *,
        checked: bool = False,
        fresh: bool = False,
    ) -> None:
        """
        Run one attempt under its step lease and record its outcome, fenced to
        it. A success is left on ``step`` (status and result as a replay will
        see them); after a failure the caller reads the step again. ``checked``:
        the claim itself was guarded by the run's state. ``fresh``: ``step``
        was read after its claim, so its budget columns are the claim's; a
        failure that spends the budget is then held like a success, to commit
        with the run's failure (left on ``step`` too).
        """
        if not checked:
            self._check_claimed(step)
        renewal = StepLeaseRenewal(step, lease_ms, self._using)
        renewal.start()
        try:
            with running_step(StepHandle(self.run_id, step.step_name, step.attempt, renewal.lost)):
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    # An async step runs in this lane (its lease renewed by
                    # the keeper while it awaits); a replay never calls it.
                    result = wait_for_awaitable(result)
        except PASS_CONTROL:
            renewal.stop()
            raise
        except BaseException as error:
            # Whatever the step raises is its attempt's error, SystemExit and
            # KeyboardInterrupt included: only the worker's own signals stop it.
            logger.info("Step %r attempt %s failed: %r", step.step_name, step.attempt, error)
            failure = self._steps_store().prepare_finish(step.pk, step.attempt, error=error)
            if self._defers and fresh and spends_budget(step):
                # The run fails with it: one commit for both (issue 14).
                self._pending = PendingOutcome(step, failure, renewal)
                step.status, step.error, step.lease_expires_at = (
                    "failed",
                    json.loads(failure.error_text),
                    None,
                )
                return
            renewal.stop()
            self._write_outcome(step, failure)
            return
        try:
            # The result is refused before any SQL runs when it is not JSON.
            finish = self._steps_store().prepare_finish(step.pk, step.attempt, result=result)
        except InvalidArgumentError as error:
            renewal.stop()
            bad = TypeError(
                f"Step {step.step_name!r} returned a result that cannot be stored "
                f"(not JSON, too large or holding a NUL): {error}"
            )
            self._write_outcome(step, self._steps_store().prepare_finish(step.pk, step.attempt, error=bad))
            return
        if self._defers:
            # Committed by the pass's next write, or with the run's outcome
            # when the workflow ends here: one commit fewer. A crash before
            # then runs the step again as a new attempt, under the same fence.
            self._pending = PendingOutcome(step, finish, renewal)
        else:
            renewal.stop()
            self._write_outcome(step, finish)
        step.status, step.result, step.error, step.lease_expires_at = "succeeded", finish.stored, None, None

    def _steps_store(self) -> Any:
        return WorkflowStep.objects.db_manager(self._using)

    def _write_outcome(self, step: WorkflowStep, finish: PreparedFinish) -> None:
        try:
            self._steps_store().write_finish(finish)
        except StepSupersededError:
            self._stale(step)

    def _stale(self, step: WorkflowStep) -> NoReturn:
        """
        A newer attempt owns ``step`` (this one's lease lapsed, or a cancel
        fenced it): its outcome is the step's, and this pass is stale.
        """
        logger.warning("Step %r attempt %s was superseded; stopping this pass.", step.step_name, step.attempt)
        raise Stop("superseded") from None

    @property
    def scheduled_at(self) -> datetime.datetime | None:
        """
        The instant (an aware UTC ``datetime``) of the schedule tick that
        started this run, or None for a run no schedule started.
        """
        from pikku_django.schedules import scheduled_at

        return scheduled_at(self.run, using=self._using)  # type: ignore[no-any-return, unused-ignore]
