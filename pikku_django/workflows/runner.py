"""Driving runs: one pass under the run lease, and starting runs."""

from __future__ import annotations

import logging
import threading
import time
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
)
from pikku_django.leases import hold_lease, keep_lease
from pikku_django.managers import ACTIVE_RUN_STATUSES, FINISHED_RUN_STATUSES, serialize_error
from pikku_django.managers.base import write_alias
from pikku_django.managers.fence import RunFence
from pikku_django.managers.passes import HeldFinish, finish_pass
from pikku_django.models import DEFAULT_QUEUE, Lease, WorkflowRun, WorkflowStep
from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.workflows.context import RETRY_SOON_MS, RunContext
from pikku_django.workflows.registry import WorkflowFunction, get_workflow
from pikku_django.workflows.waits import Stop, Suspend, suspend_run

if TYPE_CHECKING:
    from pikku_django.workflows.attempts import PendingOutcome

logger = logging.getLogger(__name__)

#: How long a run whose workflow this process does not know waits for a worker that does.
UNKNOWN_WORKFLOW_RETRY_MS = 60_000


def start_workflow(
    name: str,
    input: Any = None,
    *,
    inline: bool = False,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    idempotency_key: str | None = None,
    timeout_ms: int | None = None,
    using: str | None = None,
) -> WorkflowRun:
    """
    Start a run of the workflow ``name`` on ``queue``, due at once for a
    worker (higher ``priority`` first); with ``inline=True``, drive it to its
    end here first. A failed run is returned, not raised. A second start with
    the same ``idempotency_key`` returns the first run, whatever its status;
    ``timeout_ms`` sets a deadline on the database clock. ``using``: the
    database (default: the router's ``db_for_write``).
    """
    get_workflow(validate.name("name", name))
    validate.json_value("input", input)
    validate.queue_name("queue", queue)
    validate.priority("priority", priority)
    if timeout_ms is not None:
        validate.positive_ms("timeout_ms", timeout_ms)
    runs = WorkflowRun.objects.db_manager(write_alias(WorkflowRun, using))
    if idempotency_key is None:
        run = runs.create_run(name, input, queue=queue, priority=priority, timeout_ms=timeout_ms)
    else:
        run = runs.start_run(
            name,
            input,
            idempotency_key=idempotency_key,
            timeout_ms=timeout_ms,
            queue=queue,
            priority=priority,
        )
    if inline:
        run = _drive_inline(run)
    return run


def _drive_inline(run: WorkflowRun) -> WorkflowRun:
    """Drive the run here until it ends, or waits for something no pass here can bring (a signal)."""
    while True:
        run = run_workflow(run.pk, using=run._state.db)
        if run.is_finished:
            return run
        if run.wake_at is None:
            # Waiting on a child, or on the items of a fan-out: drive the child
            # (or the next due item) inline too; the last end wakes this run.
            children = WorkflowRun.objects.using(run._state.db).filter(parent=run)
            child = (
                children.filter(parent_steps__run=run, parent_steps__status="running")
                .exclude(status__in=FINISHED_RUN_STATUSES)
                .first()
            ) or children.filter(parent_step__isnull=False, status="running").order_by("parent_index").first()
            if child is None or not _drive_inline(child).is_finished:
                return run
            continue
        wait_ms = run.wake_at - Lease.objects.db_manager(run._state.db).db_now_ms()
        if wait_ms > 0:
            time.sleep(wait_ms / 1000)


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
        logger.error("Run %s is of workflow %r, which this process does not know.", run.pk, run.workflow)
        _set_wake(run, DbNowMs() + UNKNOWN_WORKFLOW_RETRY_MS)
        return run
    if lease is None:
        holding = hold_lease(run.lease_key, conf.LEASE_TTL_MS, holder, using=alias)
    else:
        holding = keep_lease(lease, conf.LEASE_TTL_MS, using=alias)
    try:
        with holding as held:
            fence = RunFence(held.key, held.lease.holder, held.token)
            if run.status == "suspended":
                # A wait that timed out (or a wake that raced the suspension): drive it.
                runs.filter(pk=run.pk, status="suspended").filter(fence.held(alias)).update(status="running")
                run.status = "running"
            ctx = RunContext(
                run, using=alias, held=held, stop=stop, fence=fence, claimed=claimed, steps=steps
            )
            ctx.hold = hold
            ctx.take_checked = not taken_ahead
            try:
                _drive(run, fn, ctx, fence)
            finally:
                # A success still pending here (an outage, an abort) is not
                # written: its step runs again as a new attempt.
                ctx.take_outcome()
    except LeaseTakenError:
        # Held elsewhere: look again a second later. Unconditionally, so that a
        # worker's take (wake_at at its own lease's end) doesn't delay it.
        runs.filter(pk=run.pk, status="running").update(wake_at=DbNowMs() + RETRY_SOON_MS)
    except LeaseLostError:
        # What the pass wrote while it held the lease stays; nothing after.
        logger.warning("Run %s lost its run lease during a pass.", run.pk)
    return run


def _drive(run: WorkflowRun, fn: WorkflowFunction, ctx: RunContext, fence: RunFence) -> None:
    try:
        output = fn(ctx, run.input)
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
            raise failure.cause from None
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
        logger.info("Run %s failed: %r", run.pk, error)
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
        if pending is None or isinstance(error, OUTAGE_ERRORS):
            raise
        logger.error("Run %s: the store failed under its pass: %r", run.pk, error)
        _finish_now(run, "failed", ctx, None, error=serialize_error(RunStoreError(run.pk, error)))
        return
    _ended(run, status, ctx, done, fields)


def _ended(run: WorkflowRun, status: str, ctx: RunContext, done: bool, fields: dict[str, Any]) -> None:
    """The run's outcome has committed (``done``: this pass recorded it): tell those who asked."""
    if done:
        run.status, run.wake_at = status, None
        for name, value in fields.items():
            setattr(run, name, value)
        ctx.ended(status)


def _set_wake(run: WorkflowRun, wake_at: Any) -> None:
    WorkflowRun.objects.using(run._state.db).filter(pk=run.pk, status="running").update(
        wake_at=wake_at, updated_at=DbNow()
    )
