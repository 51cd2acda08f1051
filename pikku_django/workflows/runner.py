"""Driving runs: one pass under the run lease, and starting runs."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import InvalidArgumentError, LeaseLostError, LeaseTakenError, StepFailedError
from pikku_django.leases import hold_lease
from pikku_django.managers import serialize_error
from pikku_django.models import Lease, WorkflowRun
from pikku_django.workflows.context import RETRY_SOON_MS, RunContext, Stop, Suspend
from pikku_django.workflows.registry import WorkflowFunction, get_workflow

logger = logging.getLogger(__name__)

#: How long a run whose workflow this process does not know waits for a worker that does.
UNKNOWN_WORKFLOW_RETRY_MS = 60_000


def start_workflow(name: str, input: Any = None, *, inline: bool = False) -> WorkflowRun:
    """
    Start a run of the workflow ``name``, due at once for a worker; with
    ``inline=True``, drive it to its end here first. A failed run is returned,
    not raised.
    """
    get_workflow(validate.name("name", name))
    run = WorkflowRun.objects.create_run(name, input)
    if inline:
        run = _drive_inline(run)
    return run


def _drive_inline(run: WorkflowRun) -> WorkflowRun:
    while True:
        run = run_workflow(run.pk)
        if run.is_finished or run.wake_at is None:
            return run
        wait_ms = run.wake_at - Lease.objects.db_now_ms()
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
    alias = using or DEFAULT_DB_ALIAS
    runs = WorkflowRun.objects.using(alias)
    try:
        run = runs.get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError):
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.") from None
    drive_run(run, holder=holder, stop=stop)
    return runs.get(pk=run.pk)


def drive_run(
    run: WorkflowRun, *, holder: str | None = None, stop: threading.Event | None = None
) -> WorkflowRun:
    """
    ``run_workflow`` on a run already read (a worker's take reads it): one
    pass, without reading the run before or after. Returns ``run`` with the
    outcome this pass wrote (status, output, error, wake_at) set on it.
    """
    alias = run._state.db or DEFAULT_DB_ALIAS
    if run.status != "running":
        return run
    try:
        fn = get_workflow(run.workflow)
    except InvalidArgumentError:
        logger.error("Run %s is of workflow %r, which this process does not know.", run.pk, run.workflow)
        _set_wake(run, DbNowMs() + UNKNOWN_WORKFLOW_RETRY_MS)
        return run
    try:
        with hold_lease(run.lease_key, conf.LEASE_TTL_MS, holder, using=alias) as held:
            _drive(run, fn, RunContext(run, using=alias, held=held, stop=stop))
    except LeaseTakenError:
        # Held elsewhere: look again a second later. Unconditionally, so that a
        # worker's take (wake_at at its own lease's end) doesn't delay it.
        _set_wake(run, DbNowMs() + RETRY_SOON_MS, touch=False)
    except LeaseLostError:
        # What the pass wrote stays: every step write was fenced to its attempt.
        logger.warning("Run %s lost its run lease during a pass.", run.pk)
    return run


def _drive(run: WorkflowRun, fn: WorkflowFunction, ctx: RunContext) -> None:
    try:
        output = fn(ctx, run.input)
    except Suspend as suspend:
        logger.debug("Run %s suspends: %s", run.pk, suspend.reason)
        _set_wake(run, suspend.wake_at)
        return
    except Stop as stop:
        logger.info("Run %s: pass stopped (%s).", run.pk, stop)
        return
    except StepFailedError as error:
        _finish(run, "failed", error={**error.error, "step": error.step_name})
        return
    except Exception as error:
        logger.info("Run %s failed: %r", run.pk, error)
        _finish(run, "failed", error=serialize_error(error))
        return
    try:
        validate.json_value("output", output)
    except InvalidArgumentError as error:
        bad = TypeError(f"Workflow {run.workflow!r} returned an output that is not JSON: {error}")
        _finish(run, "failed", error=serialize_error(bad))
        return
    _finish(run, "completed", output=output, error=None)


def _finish(run: WorkflowRun, status: str, **fields: Any) -> None:
    """Record the run's outcome, unless it already has one (the status guard)."""
    written = (
        WorkflowRun.objects.using(run._state.db)
        .filter(pk=run.pk, status="running")
        .update(status=status, wake_at=None, updated_at=DbNow(), **fields)
    )
    if written:
        run.status, run.wake_at = status, None
        for name, value in fields.items():
            setattr(run, name, value)


def _set_wake(run: WorkflowRun, wake_at: Any, *, touch: bool = True) -> None:
    changes = {"wake_at": wake_at, "updated_at": DbNow()} if touch else {"wake_at": wake_at}
    WorkflowRun.objects.using(run._state.db).filter(pk=run.pk, status="running").update(**changes)
