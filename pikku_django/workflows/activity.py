"""
What a worker tells at its default verbosity (the ``pikku_django.activity``
logger, at INFO), and the signals of ``pikku_django.signals``: a run's end,
a failed attempt and its retry, a step taken over from a lost worker. Each
line names the run. Nothing here runs a statement unless a worker was lost.
"""

from __future__ import annotations

import logging
from typing import Any

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.signals import attempt_failed, run_finished, send_after_commit, worker_lost
from pikku_django.workflows import tracing

#: ``manage.py pikku_worker`` shows this logger's INFO at verbosity 1.
logger = logging.getLogger("pikku_django.activity")

__all__ = [
    "last_line",
    "lost_holder",
    "run_name",
    "tell_attempt_failed",
    "tell_run_ended",
    "tell_worker_lost",
]


def last_line(error: Any) -> str:
    """
    The line of an error a reader wants first: ``Type: message``'s last
    line, from an exception or a stored error (``serialize_error``'s dict).
    """
    if isinstance(error, BaseException):
        kind, message = type(error).__name__, str(error)
    elif isinstance(error, dict):
        kind = str(error.get("type") or "Error").rsplit(".", 1)[-1]
        message = str(error.get("message") or "")
    else:
        kind, message = "Error", "" if error is None else str(error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return f"{kind}: {lines[-1]}" if lines else kind


def run_name(run: WorkflowRun) -> str:
    """What a line calls ``run``'s work: its workflow, or for a Django task's run its task's path."""
    name = run.display_name
    return name if name == run.workflow else f"task {name}"


def tell_run_ended(run: WorkflowRun, status: str, using: str) -> None:
    """A pass recorded ``run``'s outcome ``status`` and it has committed."""
    if status == "failed":
        step = run.error.get("step") if isinstance(run.error, dict) else None
        where = f" in step {step!r}" if step else ""
        logger.info("Run %s (%s) failed%s: %s", run.pk, run_name(run), where, last_line(run.error))
    else:
        logger.info("Run %s (%s) %s.", run.pk, run_name(run), status)
    send_after_commit(run_finished, WorkflowRun, using, run=run)


def tell_attempt_failed(
    run: WorkflowRun, step: WorkflowStep, error: BaseException, using: str, *, attempt: int, retried: bool
) -> None:
    """An attempt of ``step`` raised ``error``, its failure committed; ``retried``: it has attempts left."""
    if retried:
        logger.info(
            "Run %s: step %r attempt %s failed (%s); it will be retried.",
            run.pk,
            step.step_name,
            attempt,
            last_line(error),
        )
    else:
        logger.info(
            "Run %s: step %r attempt %s failed (%s); no attempt is left.",
            run.pk,
            step.step_name,
            attempt,
            last_line(error),
        )
    send_after_commit(attempt_failed, WorkflowStep, using, run=run, step=step, attempt=attempt, error=error)


def lost_holder(step: WorkflowStep, attempt: int, using: str) -> str | None:
    """
    The worker of ``step``'s ``attempt`` if that attempt was lost (its
    history row still running while a later attempt runs), else None. One
    read, made only after a claim that took a step over.
    """
    row = (
        WorkflowStepAttempt.objects.using(using)
        .filter(step_id=step.pk, attempt=attempt)
        .values_list("status", "holder")
        .first()
    )
    if row is None or row[0] != "running":
        return None
    return row[1]


def tell_worker_lost(run: WorkflowRun, step: WorkflowStep, holder: str, using: str) -> None:
    """``step``'s attempt before ``step.attempt`` lost its worker ``holder``, and this one took it over."""
    logger.info(
        "Run %s: step %r taken over from lost worker %s (attempt %s).",
        run.pk,
        step.step_name,
        holder or "(unknown)",
        step.attempt,
    )
    tracing.worker_lost(run, step.step_name, step.attempt, holder)
    send_after_commit(worker_lost, WorkflowStep, using, run=run, step=step, holder=holder)
