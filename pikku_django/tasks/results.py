"""
Task paths and results: a stored task is one run of the ``pikku_django.task``
workflow with one step, ``task``; its ``TaskResult`` is read from the run, the
step and the step's attempts.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.utils.module_loading import import_string

from pikku_django import validate
from pikku_django.errors import TaskPathError, WorkerLostError
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus

#: The workflow every task is stored as, and the name of its one step.
TASK_WORKFLOW = "pikku_django.task"
TASK_STEP = "task"


def resolve_task(path: object) -> Task[..., Any]:
    """
    The ``Task`` that ``path`` names. A path that names anything else (a plain
    function, a class, a module) is refused with ``TaskPathError`` and never
    called; importing its module is how it is found.
    """
    path = validate.name("task", path)
    module, _, attribute = path.rpartition(".")
    if not module or not attribute.isidentifier():
        raise TaskPathError(path, "not a dotted path")
    try:
        found = import_string(path)
    except ImportError as e:
        raise TaskPathError(path, f"not importable: {e}") from None
    if not isinstance(found, Task):
        raise TaskPathError(path, f"it is a {type(found).__name__}")
    if found.module_path != path:
        raise TaskPathError(path, f"it is the Task {found.module_path!r}, stored under another name")
    return found


def epoch_ms(when: datetime.datetime) -> int:
    """An aware datetime as epoch milliseconds (the unit ``wake_at`` is in)."""
    return int(when.timestamp() * 1000)


def from_epoch_ms(ms: int) -> datetime.datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def _task_error(error: dict[str, Any] | None) -> TaskError:
    error = error or {}
    return TaskError(
        exception_class_path=str(error.get("type", "pikku_django.errors.PikkuError")),
        traceback=str(error.get("traceback") or error.get("message", "")),
    )


def _lost_error(attempt: WorkflowStepAttempt) -> TaskError:
    lost = WorkerLostError(
        f"Attempt {attempt.attempt} ran on worker {attempt.holder or '(unnamed)'}, which stopped "
        "renewing its step lease (it died or lost the database); the task was taken again as a "
        "new attempt."
    )
    cls = type(lost)
    return TaskError(exception_class_path=f"{cls.__module__}.{cls.__qualname__}", traceback=str(lost))


def build_result(
    task: Task[..., Any],
    backend: str,
    run: WorkflowRun,
    step: WorkflowStep | None,
    attempts: list[WorkflowStepAttempt],
    now_ms: int,
) -> TaskResult[..., Any]:
    """The ``TaskResult`` of a stored task, from its rows as read at ``now_ms`` (DB clock)."""
    started = [a for a in attempts if a.running_at is not None]
    if run.status == "completed":
        status = TaskResultStatus.SUCCESSFUL
    elif run.is_finished:
        status = TaskResultStatus.FAILED
    elif step is not None and (
        step.status == "succeeded" or (step.status == "running" and (step.lease_expires_at or 0) > now_ms)
    ):
        status = TaskResultStatus.RUNNING
    else:
        status = TaskResultStatus.READY
    errors: list[TaskError] = []
    for attempt in started:
        if attempt.status == "failed":
            errors.append(_task_error(attempt.error))
        elif step is not None and attempt.attempt < step.attempt and attempt.status == "running":
            errors.append(_lost_error(attempt))
    if status == TaskResultStatus.FAILED and not errors and run.error:
        # The run failed around its step (its task path refused, say).
        errors.append(_task_error(run.error))
    stored = run.input or {}
    result = TaskResult(
        task=task,
        id=str(run.pk),
        status=status,
        enqueued_at=run.created_at,
        started_at=started[0].running_at if started else None,
        finished_at=run.updated_at if run.is_finished else None,
        last_attempted_at=started[-1].running_at if started else None,
        args=list(stored.get("args", [])),
        kwargs=dict(stored.get("kwargs", {})),
        backend=backend,
        errors=errors,
        worker_ids=[a.holder for a in started],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", run.output)
    return result


def read_result(task: Task[..., Any], backend: str, run: WorkflowRun, now_ms: int) -> TaskResult[..., Any]:
    """Read the step and attempts of ``run`` and build its result (two queries)."""
    using = run._state.db
    step = WorkflowStep.objects.using(using).filter(run=run, step_name=TASK_STEP).first()
    attempts = (
        list(WorkflowStepAttempt.objects.using(using).filter(step=step).order_by("attempt"))
        if step is not None
        else []
    )
    return build_result(task, backend, run, step, attempts, now_ms)
