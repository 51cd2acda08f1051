"""Operating a run that went wrong: retry it where it stopped, or fork it from a step."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import router

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowRun
from pikku_django.store.operate import fork_run, retry_run


def _run_pk(run_id: Any) -> uuid.UUID:
    """``run_id`` as a run's primary key, or a ``ValueError`` naming it."""
    try:
        return run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except (TypeError, ValueError, AttributeError):
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.") from None


def retry_workflow(run_id: Any, *, timeout_ms: int | None = None, using: str | None = None) -> bool:
    """
    Run a failed, cancelled or timed-out run again from where it stopped, due
    at once: succeeded steps replay, the step that failed (or was fenced)
    gets a fresh budget of ``retries + 1`` attempts, a failed child step
    starts a new child. The deadline is cleared, or set ``timeout_ms`` from
    now. A run parked for a history that no longer fits its code
    (``PIKKU_ON_REPLAY_MISMATCH = "park"``) is revived too, its error
    cleared. False for a run that is running, suspended (not parked) or
    completed, and for all but one of several retries racing.
    """
    pk = _run_pk(run_id)
    if timeout_ms is not None:
        validate.positive_ms("timeout_ms", timeout_ms)
    return retry_run(using or router.db_for_write(WorkflowRun), pk, timeout_ms)


def fork_workflow(run_id: Any, from_step: str | None = None, *, using: str | None = None) -> WorkflowRun:
    """
    A new run of the run's workflow and input (``forked_from`` points at the
    original, which is left as it is), with the succeeded steps before
    ``from_step`` copied, so it runs on from ``from_step`` with today's code;
    without ``from_step``, from the start. Any status.
    """
    pk = _run_pk(run_id)
    if from_step is not None:
        validate.name("from_step", from_step)
    return fork_run(using or router.db_for_write(WorkflowRun), pk, from_step)  # type: ignore[no-any-return]
