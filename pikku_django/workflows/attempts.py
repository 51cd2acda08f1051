"""
One attempt of a step in a pass: run and its outcome recorded
(``AttemptsMixin``), its lease kept renewed meanwhile by the process's
keeper, its arguments as stored, and its outcome held for the pass's next
write.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, NoReturn

from asgiref.sync import async_to_sync

from pikku_django.clock import DbNowMs, EpochMs
from pikku_django.errors import InvalidArgumentError, StepSupersededError, StepTimeoutError
from pikku_django.keeper import keeper
from pikku_django.leases import KeepAlive
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.managers.fence import RunFence
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.policy import StepPolicy, Verdict
from pikku_django.workflows import tracing
from pikku_django.workflows.activity import lost_holder, tell_attempt_failed, tell_worker_lost
from pikku_django.workflows.current import StepHandle, running_step
from pikku_django.workflows.timeouts import attempt_deadline_s, await_within, run_within
from pikku_django.workflows.unwind import PASS_CONTROL, Stop, Suspend

# Attempts log under the run context's name, as they did when they ran in
# ``context``, so logging set up for it still sees them.
logger = logging.getLogger("pikku_django.workflows.context")


class StepLeaseRenewal(KeepAlive):
    """
    Keeps one attempt's step lease renewed while its function runs, through
    the process's keeper (one renewal thread for every step lease held). It
    answers "lost" once the step is no longer running as this attempt.
    """

    def __init__(self, step: WorkflowStep, lease_ms: int, using: str) -> None:
        super().__init__(f"step {step.step_name!r} (attempt {step.attempt})", lease_ms, using)
        self.step_id = step.pk
        self.attempt = step.attempt

    def renew(self) -> bool:
        return WorkflowStep.objects.db_manager(self.using).refresh_lease(
            self.step_id, self.ttl_ms, attempt=self.attempt
        )

    def batch_key(self) -> Hashable | None:
        return (StepLeaseRenewal, self.using, self.ttl_ms)

    @classmethod
    def renew_together(cls, kept: Sequence[KeepAlive]) -> bool:
        """Every step lease of ``kept`` (one database and lease) in one UPDATE (``refresh_leases``)."""
        renewals = [item for item in kept if isinstance(item, StepLeaseRenewal)]
        steps = WorkflowStep.objects.db_manager(renewals[0].using)
        return steps.refresh_leases([(item.step_id, item.attempt) for item in renewals], renewals[0].ttl_ms)

    def start(self) -> None:
        keeper().keep(self)

    def stop(self) -> None:
        keeper().drop(self)


def wait_for_awaitable(awaitable: Awaitable[Any]) -> Any:
    """The result of an async step's awaitable, on an event loop of its own (or the caller's, via asgiref)."""

    async def wait() -> Any:
        return await awaitable

    return async_to_sync(wait)()


def step_data(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The step's arguments, stored for the admin when they are JSON."""
    data = {"args": list(args), "kwargs": kwargs}
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return data


@dataclass
class PendingOutcome:
    """
    A step's success not yet committed: its outcome as it will be written
    (fenced to its attempt), and the renewal that keeps its step lease
    alive until then, so no claim or sweep takes the step for lost meanwhile.
    """

    step: WorkflowStep
    finish: PreparedFinish
    renewal: StepLeaseRenewal
    #: When it was held (monotonic).
    since: float = field(default_factory=time.monotonic)


def spends_budget(step: WorkflowStep) -> bool:
    """Would ``step``, running now, be exhausted once this attempt's failure is recorded?"""
    status = step.status
    step.status = "failed"
    try:
        return step.is_exhausted
    finally:
        step.status = status


def spend(step: WorkflowStep) -> None:
    """``step``'s budget spent by its current attempt, in memory, as a ``final`` failure's write spends it."""
    losses = 0 if step.worker_losses is None else step.losses
    step.retries = max(step.attempt - step.budget_base - 1 - losses, 0)


class AttemptsMixin:
    """Running one attempt of a step and recording its outcome (mixed into ``RunContext``)."""

    run_id: Any
    run: WorkflowRun
    holder: str | None
    _fence: RunFence | None
    _using: str
    _defers: bool
    _pending: PendingOutcome | None
    _check_claimed: Callable[[WorkflowStep], None]
    _stop: threading.Event | None
    #: The policy of the step this pass runs now (``ctx.step``'s options), or None.
    _policy: StepPolicy | None = None
    #: The most bytes of JSON a step's result may take in this run, and why
    #: (a map item's share of ``PIKKU_MAX_JSON_BYTES``); None: the limit alone.
    result_bound: tuple[int, str] | None = None
    #: What an attempt past its ``timeout_ms`` fails with (a task's run sets ``TaskTimeoutError``).
    timeout_error: type[StepTimeoutError] = StepTimeoutError
    #: Told of an attempt this lane failed by its timeout (a task's run reports it).
    on_timeout: Callable[[StepTimeoutError], None] | None = None
    on_failed: Callable[[Callable[[WorkflowRun], None]], None]

    def budget(self, retries: int | None) -> dict[str, int | None]:
        """The budget columns a new step of the current policy is stored with."""
        if self._policy is None:
            return {"retries": retries, "worker_losses": None}
        retries, worker_losses = self._policy.budget(retries)
        return {"retries": retries, "worker_losses": worker_losses}

    def _wait_retry_delay(self, step: WorkflowStep) -> None:
        """
        A failed ``step`` with a retry delay (fixed, or its backoff's last):
        suspend until the delay since its failure has passed. The run's
        ``wake_at`` becomes that instant on the database clock.
        """
        if step.status != "failed" or not step.retry_delay:
            return
        # Judged in epoch ms on the database clock, never from a
        # naive datetime (USE_TZ = False).
        failed_ms, now = (
            WorkflowStep.objects.db_manager(self._using)
            .filter(pk=step.pk)
            .annotate(failed_ms=EpochMs("updated_at"), now=DbNowMs())
            .values_list("failed_ms", "now")
            .get()
        )
        due = int(failed_ms) + step.retry_delay
        if now < due:
            raise Suspend(due, f"step {step.step_name!r} waits {step.retry_delay} ms to retry")

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
            handle = StepHandle(
                self.run_id, step.step_name, step.attempt, renewal.lost, step_id=step.pk, using=self._using
            )
            with self._traced(step):
                result = self._call(step, handle, fn, args, kwargs)
        except PASS_CONTROL:
            renewal.stop()
            raise
        except BaseException as error:
            # Whatever the step raises is its attempt's error, SystemExit and
            # KeyboardInterrupt included: only the worker's own signals stop it.
            self._record_failure(step, error, renewal, fresh=fresh)
            return
        self._record_success(step, result, renewal)

    def _call(
        self,
        step: WorkflowStep,
        handle: StepHandle,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """
        One call of the step's function: in this lane; or, with a
        ``timeout_ms``, in a thread of its own that this lane leaves at its
        deadline on the database clock (``timeouts.run_within``).
        """
        timeout_ms = None if self._policy is None else self._policy.timeout_ms

        def call() -> Any:
            with running_step(handle):
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    # An async step runs in this lane (its lease renewed by
                    # the keeper while it awaits); a replay never calls it.
                    result = await_within(result)
                return result

        if timeout_ms is None:
            return call()
        seconds = attempt_deadline_s(step.pk, step.attempt, timeout_ms, self._using)
        error = functools.partial(self.timeout_error, step.step_name, step.attempt, timeout_ms)
        try:
            return run_within(call, seconds, error, stop=self._stop)
        except StepTimeoutError as timed_out:
            if self.on_timeout is not None:
                self.on_timeout(timed_out)
            raise

    def _record_failure(
        self, step: WorkflowStep, error: BaseException, renewal: StepLeaseRenewal, *, fresh: bool
    ) -> None:
        """
        Record the attempt's ``error``, written at once; or, in a pass, for a
        ``fresh`` step whose budget it spends, held to commit with the run's
        failure (and left on ``step``).
        """
        verdict = Verdict(final=False) if self._policy is None else self._policy.verdict(step.attempt, error)
        failure = self._steps_store().prepare_finish(
            step.pk, step.attempt, error=error, next_delay=verdict.delay, final=verdict.final
        )
        if verdict.final:
            # No other attempt (retry_on, a NonRetryableError, a backoff's None).
            spend(step)
        last = spends_budget(step)
        tell = self._tell_failure(step, error, retried=not last)
        if self._defers and fresh and last:
            # The run fails with it: one commit for both (issue 14).
            self._pending = PendingOutcome(step, failure, renewal)
            step.status, step.error, step.lease_expires_at = (
                "failed",
                json.loads(failure.error_text),
                None,
            )
            self.on_failed(lambda run: tell())
            return
        renewal.stop()
        self._write_outcome(step, failure)
        tell()

    def _traced(self, step: WorkflowStep) -> AbstractContextManager[None]:
        """The attempt's span (``workflows.tracing``)."""
        fence = self._fence
        token = None if fence is None else fence.token
        return tracing.attempt(self.run, step.step_name, step.attempt, self.holder, token)

    def _tell_lost(self, step: WorkflowStep) -> None:
        """Log and signal a worker lost with ``step``'s attempt before this one, if it was."""
        holder = lost_holder(step, step.attempt - 1, self._using)
        if holder is not None:
            tell_worker_lost(self.run, step, holder, self._using)

    def _tell_failure(self, step: WorkflowStep, error: BaseException, *, retried: bool) -> Callable[[], None]:
        """Log the failed attempt now; what it returns sends ``attempt_failed`` once the failure commits."""
        logger.debug("Step %r attempt %s failed: %r", step.step_name, step.attempt, error)
        run, using, attempt = self.run, self._using, step.attempt

        def tell() -> None:
            tell_attempt_failed(run, step, error, using, attempt=attempt, retried=retried)

        return tell

    def _record_success(self, step: WorkflowStep, result: Any, renewal: StepLeaseRenewal) -> None:
        """
        Record the attempt's ``result`` (a failure when it cannot be stored):
        held in a pass for its next write, else written at once; the success
        is left on ``step``.
        """
        try:
            # The result is refused before any SQL runs when it is not JSON.
            finish = self._steps_store().prepare_finish(step.pk, step.attempt, result=result)
            self._within_bound(finish)
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

    def _within_bound(self, finish: PreparedFinish) -> None:
        """Refuse a result longer than ``result_bound`` (``InvalidArgumentError``, before any SQL)."""
        text = finish.result_text
        if self.result_bound is not None and text is not None and len(text) > self.result_bound[0]:
            raise InvalidArgumentError(f"result is {len(text)} bytes of JSON; {self.result_bound[1]}.")

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


__all__ = [
    "AttemptsMixin",
    "PendingOutcome",
    "StepLeaseRenewal",
    "spend",
    "spends_budget",
    "step_data",
    "wait_for_awaitable",
]
