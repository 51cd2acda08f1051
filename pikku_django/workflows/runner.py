"""Driving runs: one pass under the run lease (starting them: ``workflows.starts``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    LeaseLostError,
    LeaseTakenError,
    RunStoreError,
    StepFailedError,
    StepSupersededError,
    StoreFailure,
    WorkerAbortedError,
    WorkflowReplayError,
)
from pikku_django.leases import HeldLease, hold_lease, keep_lease
from pikku_django.managers import ACTIVE_RUN_STATUSES, serialize_error
from pikku_django.managers.base import write_alias
from pikku_django.managers.fence import RunFence
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.sql.conflicts import is_conflict
from pikku_django.store.passes import HeldFinish, finish_pass, give_back_pass
from pikku_django.workflows import tracing
from pikku_django.workflows.activity import tell_run_ended
from pikku_django.workflows.context import RETRY_SOON_MS, RunContext
from pikku_django.workflows.in_progress import in_progress
from pikku_django.workflows.registry import WorkflowFunction, get_workflow
from pikku_django.workflows.replay import parked, replayed, resume_run
from pikku_django.workflows.waits import Stop, Suspend, suspend_run

if TYPE_CHECKING:
    from pikku_django.workflows.attempts import PendingOutcome

logger = logging.getLogger(__name__)

#: How long a run whose workflow this process does not know waits for a worker that does.
UNKNOWN_WORKFLOW_RETRY_MS = 60_000


def run_workflow(
    run_id: Any,
    *,
    holder: str | None = None,
    stop: threading.Event | None = None,
    using: str | None = None,
) -> WorkflowRun:
    """
    Drive one pass of the run under its run lease: replay finished steps, run
    the next ones, until the run ends or meets a step it cannot run now. A run
    held elsewhere is woken again a second later. Returns the run as it is now.
    """
    alias = write_alias(WorkflowRun, using)
    runs = WorkflowRun.objects.using(alias)
    try:
        run = runs.get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError):
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.") from None
    drive_run(run, holder=holder, stop=stop)
    return runs.get(pk=run.pk)


def drive_run(
    run: WorkflowRun,
    *,
    holder: str | None = None,
    stop: threading.Event | None = None,
    lease: Lease | None = None,
    claimed: dict[str, int] | None = None,
    hold: Callable[[HeldFinish], None] | None = None,
    steps: list[WorkflowStep] | None = None,
    taken_ahead: bool = False,
) -> WorkflowRun:
    """
    ``run_workflow`` on a run already read (a worker's take reads it): one
    pass, without reading the run before or after. Returns ``run``, with the
    outcome when this pass recorded one (status, output, error). ``lease``:
    the run lease, when the take acquired it in its own commit; ``claimed``:
    the steps that take claimed (name to attempt), which the pass runs;
    ``steps``: every step of the run, when the take read them (its only one).
    ``taken_ahead``: the take took the run ahead of others the lane drove
    first (``managers.takes.take_run``'s ``ahead``), and some time ago: the
    step it claimed is checked against the run's state before it runs.
    ``hold``: a lane's, to keep the outcome of a run with no parent for its
    next take (``HeldFinish``); the run is then returned before its outcome
    is written.

    The pass, top to bottom: take the run lease; replay the finished steps
    and run the next ones (``RunContext``); write the suspension, or the
    outcome with the last step's success and the lease's release in one
    commit (``managers.passes.finish_pass``); release the lease if it is
    still held. Every run-level write is fenced to the run lease
    (``managers.fence``), every step write to its attempt.
    """
    alias = run._state.db or DEFAULT_DB_ALIAS
    runs = WorkflowRun.objects.using(alias)
    if run.status not in ACTIVE_RUN_STATUSES:
        return run
    try:
        fn = get_workflow(run.workflow)
    except InvalidArgumentError:
        logger.error("Run %s: unknown workflow %r; restart the worker with its code.", run.pk, run.workflow)
        _set_wake(run, DbNowMs() + UNKNOWN_WORKFLOW_RETRY_MS)
        return run
    if lease is None:
        holding = hold_lease(run.lease_key, conf.LEASE_TTL_MS, holder, using=alias)
    else:
        holding = keep_lease(lease, conf.LEASE_TTL_MS, using=alias)
    try:
        with holding as held:
            _drive_held(
                run, fn, held, stop=stop, claimed=claimed, hold=hold, steps=steps, taken_ahead=taken_ahead
            )
    except LeaseTakenError:
        # Held elsewhere: look again a second later. Unconditionally, so that a
        # worker's take (wake_at at its own lease's end) doesn't delay it.
        runs.filter(pk=run.pk, status="running").update(wake_at=DbNowMs() + RETRY_SOON_MS)
    except LeaseLostError:
        # What the pass wrote while it held the lease stays; nothing after.
        logger.warning("Run %s lost its run lease during a pass.", run.pk)
    return run


def _drive_held(
    run: WorkflowRun,
    fn: WorkflowFunction,
    held: HeldLease,
    *,
    stop: threading.Event | None,
    claimed: dict[str, int] | None,
    hold: Callable[[HeldFinish], None] | None,
    steps: list[WorkflowStep] | None,
    taken_ahead: bool,
) -> None:
    """
    ``drive_run``'s pass once it holds the run lease (``held``): a suspended
    run made running again, then the workflow driven in a ``RunContext``
    whose run-level writes are fenced to the lease.
    """
    alias = run._state.db or DEFAULT_DB_ALIAS
    fence = RunFence(held.key, held.lease.holder, held.token)
    resume_run(run, fence)
    ctx = RunContext(run, using=alias, held=held, stop=stop, fence=fence, claimed=claimed, steps=steps)
    ctx.hold = hold
    ctx.take_checked = not taken_ahead
    try:
        with in_progress(ctx), tracing.run_pass(run, fence.holder, fence.token):
            _drive(run, fn, ctx, fence)
    except OUTAGE_ERRORS as error:
        if not is_conflict(error):
            raise
        _given_back(run, ctx, error)
    finally:
        # A success still pending here (an outage, an abort) is not
        # written: its step runs again as a new attempt.
        ctx.drop_outcome()


def _drive(run: WorkflowRun, fn: WorkflowFunction, ctx: RunContext, fence: RunFence) -> None:
    try:
        output = replayed(fn, ctx, run.input)
    except WorkflowReplayError as error:
        if not parked(run, error, ctx.run_fence, lambda: _flushed(run, ctx)):
            _finish(run, "failed", ctx, error=serialize_error(error))
        return
    except Suspend as suspend:
        logger.debug("Run %s suspends: %s", run.pk, suspend.reason)
        if _flushed(run, ctx):
            suspend_run(run, suspend, fence)
        return
    except Stop as stop:
        logger.info("Run %s: pass stopped (%s).", run.pk, stop)
        # A step that ended before the stop keeps its outcome (fenced to its attempt).
        _flushed(run, ctx)
        return
    except StoreFailure as failure:
        if isinstance(failure.cause, OUTAGE_ERRORS):
            # The database went away mid-pass: no fault of the run's. The pass
            # ends here and the run is driven again once the database is back.
            # From the driver's error, whose code tells a conflict (``_drive_held``).
            raise failure.cause from failure.cause.__cause__
        logger.error("Run %s: the store failed under its pass: %r", run.pk, failure.cause)
        _finish(run, "failed", ctx, error=serialize_error(RunStoreError(run.pk, failure.cause)))
        return
    except StepFailedError as error:
        _finish(run, "failed", ctx, error={**error.error, "step": error.step_name})
        return
    except OUTAGE_ERRORS:
        raise
    except WorkerAbortedError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as error:
        # Whatever the workflow raises is its failure, SystemExit included:
        # only the worker's own signals stop the worker.
        logger.debug("Run %s failed: %r", run.pk, error)
        _finish(run, "failed", ctx, error=serialize_error(error))
        return
    try:
        validate.json_value("output", output)
    except InvalidArgumentError as error:
        bad = TypeError(
            f"Workflow {run.workflow!r} returned an output that cannot be stored "
            f"(not JSON, too large or holding a NUL): {error}"
        )
        _finish(run, "failed", ctx, error=serialize_error(bad))
        return
    _finish(run, "completed", ctx, output=output, error=None)


def _flushed(run: WorkflowRun, ctx: RunContext) -> bool:
    """Commit the pass's pending step success on its own; False if it was refused (the pass is stale)."""
    try:
        ctx.flush_outcome()
    except Stop as stop:
        logger.info("Run %s: pass stopped (%s).", run.pk, stop)
        return False
    return True


def _finish(run: WorkflowRun, status: str, ctx: RunContext, **fields: Any) -> None:
    """
    Record the run's outcome, unless it already has one or this pass lost
    its run lease, with the last step's success and the run lease's release
    in one commit, and hand it to a parent waiting on it in the same
    transaction. If that success cannot be written for a store error, the
    run fails naming it, as a store failure under the pass does.
    """
    pending = ctx.take_outcome()
    hold, held = ctx.hold, ctx.run_lease
    if hold is not None and held is not None and run.parent_id is None:
        # The lane writes it with its next take (one commit for both), or alone.
        held.hand_over()
        hold(
            HeldFinish(
                run._state.db or DEFAULT_DB_ALIAS,
                run.pk,
                status,
                held,
                ctx.run_fence,
                None if pending is None else pending.finish,
                fields,
                then=lambda done: _ended(run, status, ctx, done, fields),
                alone=lambda: _finish_now(run, status, ctx, pending, **fields),
                run=run,
            )
        )
        return
    _finish_now(run, status, ctx, pending, **fields)


def _finish_now(
    run: WorkflowRun, status: str, ctx: RunContext, pending: PendingOutcome | None, **fields: Any
) -> None:
    """``_finish`` in a commit of its own."""
    alias = run._state.db or DEFAULT_DB_ALIAS
    try:
        done = finish_pass(
            alias,
            run.pk,
            status,
            held=ctx.run_lease,
            fence=ctx.run_fence,
            outcome=None if pending is None else pending.finish,
            parent_id=run.parent_id,
            into=run,
            **fields,
        )
    except StepSupersededError:
        # A newer attempt owns the last step: its outcome is the step's, and this pass is stale.
        logger.warning("Run %s: its last step's attempt was superseded; stopping this pass.", run.pk)
        return
    except DatabaseError as error:
        if is_conflict(error):
            _given_back(run, ctx, error, pending)
            return
        if pending is None or isinstance(error, OUTAGE_ERRORS):
            raise
        logger.error("Run %s: the store failed under its pass: %r", run.pk, error)
        _finish_now(run, "failed", ctx, None, error=serialize_error(RunStoreError(run.pk, error)))
        return
    _ended(run, status, ctx, done, fields)


def _given_back(
    run: WorkflowRun, ctx: RunContext, error: Exception, pending: PendingOutcome | None = None
) -> None:
    """
    A write of the pass was rolled back for a conflict each time it was
    sent: no outage, and no worker lost. The step success the pass holds
    (``pending``, or the context's) is written alone; the steps it still
    runs are given back and the run is due at once (``give_back_pass``).
    """
    first_line = str(error).strip().split("\n")[0]
    logger.warning("Run %s: a write of its pass met conflicts (%s); it is due again.", run.pk, first_line)
    alias = run._state.db or DEFAULT_DB_ALIAS
    try:
        if pending is None:
            ctx.flush_outcome()
        else:
            WorkflowStep.objects.db_manager(alias).write_finish(pending.finish)
    except (Stop, StepSupersededError):
        pass  # another attempt owns the step: nothing of this pass's to keep
    except OUTAGE_ERRORS as again:
        if not is_conflict(again):
            raise
    ctx.drop_outcome()
    if ctx.run_fence is not None:
        give_back_pass(alias, run.pk, ctx.run_fence, ctx.run_lease)


def _ended(run: WorkflowRun, status: str, ctx: RunContext, done: bool, fields: dict[str, Any]) -> None:
    """The run's outcome has committed (``done``: this pass recorded it): tell those who asked."""
    if done:
        run.status, run.wake_at = status, None
        for name, value in fields.items():
            setattr(run, name, value)
        ctx.ended(status)  # first: an attempt failure that committed with the run's is told first
        tell_run_ended(run, status, run._state.db or DEFAULT_DB_ALIAS)


def _set_wake(run: WorkflowRun, wake_at: Any) -> None:
    WorkflowRun.objects.using(run._state.db).filter(pk=run.pk, status="running").update(
        wake_at=wake_at, updated_at=DbNow()
    )
