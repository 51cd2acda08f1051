"""
Replaying a run's history against today's code: a step function's stable
name (``@step_function``), what a history that no longer fits is
(``WorkflowReplayError``), and what becomes of its run
(``PIKKU_ON_REPLAY_MISMATCH``: failed, or parked until retried).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.conf import conf
from pikku_django.errors import StepFunctionMismatchError, WorkflowReplayError
from pikku_django.managers import ACTIVE_RUN_STATUSES, serialize_error
from pikku_django.managers.fence import RunFence
from pikku_django.managers.versions import code_version
from pikku_django.models import WorkflowRun
from pikku_django.workflows.registry import dotted_name
from pikku_django.workflows.unwind import PASS_CONTROL

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute ``@step_function`` sets on a function: its stable ``rpc_name``.
STEP_ID_ATTRIBUTE = "pikku_step_id"

#: The values of PIKKU_ON_REPLAY_MISMATCH.
ON_REPLAY_MISMATCH = ("fail", "park")


def step_function(id: str) -> Callable[[F], F]:  # noqa: A002 - DESIGN names the argument ``id``
    """
    Give a step function the stable ``rpc_name`` ``id`` (non-empty, at most
    255 characters): its stored steps still fit once it moves to another
    module or is renamed.
    """
    validate.name("id", id)

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@step_function({id!r}) decorates a function, not {fn!r}.")
        setattr(fn, STEP_ID_ATTRIBUTE, id)
        return fn

    return mark


def step_rpc_name(fn: Callable[..., Any]) -> str:
    """The ``rpc_name`` a new step of ``fn`` gets: its ``@step_function`` id, or its dotted name."""
    stable = getattr(fn, STEP_ID_ATTRIBUTE, None)
    return stable if isinstance(stable, str) else dotted_name(fn)


def fitting_rpc_name(run_id: Any, step_name: str, stored: str, fn: Callable[..., Any]) -> str:
    """
    The stored ``rpc_name`` of the step ``step_name`` when ``fn`` fits it (its
    stable id, or its ``module.qualname``, so a function given an id later
    still fits the steps stored before); else ``StepFunctionMismatchError``
    (a ``WorkflowReplayError``) naming both.
    """
    if stored in (step_rpc_name(fn), dotted_name(fn)):
        return stored
    raise StepFunctionMismatchError(run_id, step_name, stored, step_rpc_name(fn))


def replayed(fn: Callable[[Any, Any], Any], ctx: Any, input: Any) -> Any:
    """
    ``fn(ctx, input)``, the workflow driven by a pass; a ``WorkflowReplayError``
    the workflow caught (``ctx.replay_error``) is raised all the same, so the
    pass ends on it whatever the workflow did next.
    """
    try:
        output = fn(ctx, input)
    except PASS_CONTROL:
        raise
    except BaseException:
        if ctx.replay_error is not None:
            raise ctx.replay_error from None
        raise
    if ctx.replay_error is not None:
        raise ctx.replay_error
    return output


def parked(
    run: WorkflowRun, error: WorkflowReplayError, fence: RunFence | None, flushed: Callable[[], bool]
) -> bool:
    """
    A pass met ``error``: with PIKKU_ON_REPLAY_MISMATCH = "park", park the
    run (once ``flushed()`` wrote the step success the pass held) and say
    True; False when the run is to fail with it (the default, ``"fail"``).
    """
    logger.warning("Run %s: its history no longer fits the code: %s", run.pk, error)
    if conf.ON_REPLAY_MISMATCH != "park":
        return False
    if flushed():
        park_run(run, error, fence)
    return True


def resume_run(run: WorkflowRun, fence: RunFence) -> None:
    """
    The start of a pass under the run lease (``fence``): a suspended run
    (a wait that timed out, a wake that raced the suspension, or a parked
    run driven by hand, whose stored error it sheds) made running again,
    and ``driven_version`` stamped (``stamp_driven``).
    """
    if run.status == "suspended":
        alias = run._state.db or "default"
        runs = WorkflowRun.objects.using(alias).filter(pk=run.pk, status="suspended")
        runs.filter(fence.held(alias)).update(status="running", error=None)
        run.status, run.error = "running", None
    stamp_driven(run, fence)


def stamp_driven(run: WorkflowRun, fence: RunFence) -> None:
    """
    A pass under a code version other than the run's last: ``driven_version``
    becomes this process's, fenced to the pass's run lease. A pass under the
    same version (the common case) writes nothing.
    """
    version = code_version(run.workflow)
    if run.driven_version == version:
        return
    alias = run._state.db or "default"
    runs = WorkflowRun.objects.using(alias).filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES)
    runs.filter(fence.held(alias)).update(driven_version=version)
    run.driven_version = version


def park_run(run: WorkflowRun, error: WorkflowReplayError, fence: RunFence | None) -> bool:
    """
    Park the run (``PIKKU_ON_REPLAY_MISMATCH = "park"``): suspended with its
    error stored and no wake time, fenced to the pass's run lease. Nothing
    wakes it; ``retry_workflow`` revives it once the code fits again.
    """
    alias = run._state.db or "default"
    runs = WorkflowRun.objects.using(alias).filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES)
    if fence is not None:
        runs = runs.filter(fence.held(alias))
    stored = serialize_error(error)
    parked = bool(runs.update(status="suspended", wake_at=None, error=stored, updated_at=DbNow()))
    if parked:
        run.status, run.wake_at, run.error = "suspended", None, stored
        logger.warning("Run %s is parked until retried: %s", run.pk, error)
    return parked
