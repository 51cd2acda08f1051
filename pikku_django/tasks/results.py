"""
Task paths and results: a stored task is one run of the ``pikku_django.task``
workflow with one step, ``task``; its ``TaskResult`` is read from the run, the
step and the step's attempts.
"""

from __future__ import annotations

import datetime
import importlib
import sys
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from pikku_django import sql, validate
from pikku_django.conf import conf
from pikku_django.errors import StepLeaseExpiredError, TaskPathError, WorkerLostError
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.models.runs import TASK_WORKFLOW as TASK_WORKFLOW
from pikku_django.sql.cursors import hot_cursor, model_from_row
from pikku_django.tasks.compat import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus

#: The name of a task run's one step (its workflow is ``TASK_WORKFLOW``).
TASK_STEP = "task"


def resolve_task(path: object) -> Task[..., Any]:
    """
    The ``Task`` that ``path`` names, found among the Tasks this process
    knows: an attribute of a module already imported, or of a module of an
    installed app, of the settings module's package or of
    ``PIKKU_TASK_MODULES`` (imported then, as the admin imports admin.py;
    ``may_import``). Nothing else is imported, so a stored path never runs the module-level code of
    an arbitrary module; a path that names anything but a Task (a plain
    function, a class, a module) is refused with ``TaskPathError`` and never
    called.
    """
    path = validate.name("task", path)
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise TaskPathError(path, "not a dotted path")
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        # Another lane is importing it right now (the first task of a module
        # on a worker of several lanes): the import waits for it to finish.
        module = importlib.import_module(module_name)
    if module is None:
        if not may_import(module_name):
            raise TaskPathError(
                path,
                f"{module_name!r} is not imported, and is in no installed app, nor in the settings "
                "module's package, nor in PIKKU_TASK_MODULES",
                missing=True,
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise TaskPathError(path, f"not importable: {e}", missing=True) from None
    found = getattr(module, attribute, None)
    if found is None:
        raise TaskPathError(path, f"{module_name!r} has no {attribute!r}", missing=True)
    if not isinstance(found, Task):
        raise TaskPathError(path, f"it is a {type(found).__name__}")
    if found.module_path != path:
        raise TaskPathError(path, f"it is the Task {found.module_path!r}, stored under another name")
    return found


def may_import(module_name: str) -> bool:
    """
    May a stored task path import ``module_name``? When it is, or is inside,
    an installed app's package, the package of the settings module (the
    project's own, where ``settings.py`` lives), or a module or package that
    ``PIKKU_TASK_MODULES`` names.
    """
    settings_package = (settings.SETTINGS_MODULE or "").rpartition(".")[0]
    roots = [config.name for config in apps.get_app_configs()]
    roots += [settings_package] if settings_package else []
    roots += conf.TASK_MODULES
    return any(module_name == root or module_name.startswith(f"{root}.") for root in roots)


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


#: The stored type of a step failed because its worker was lost on its last attempt.
_LEASE_EXPIRED = f"{StepLeaseExpiredError.__module__}.{StepLeaseExpiredError.__qualname__}"
_LOST_TYPES = {_LEASE_EXPIRED, f"{WorkerLostError.__module__}.{WorkerLostError.__qualname__}"}


def _lost_error(run: WorkflowRun, attempt: WorkflowStepAttempt, *, last: bool) -> TaskError:
    lost = WorkerLostError(run.pk, TASK_STEP, attempt.attempt, attempt.holder, last=last)
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
        if attempt.status == "failed" and (attempt.error or {}).get("type") in _LOST_TYPES:
            # The last attempt, failed because its worker was lost: it names the worker too.
            errors.append(_lost_error(run, attempt, last=True))
        elif attempt.status == "failed":
            errors.append(_task_error(attempt.error))
        elif step is not None and attempt.attempt < step.attempt and attempt.status == "running":
            errors.append(_lost_error(run, attempt, last=False))
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
    """Read the attempts of ``run``'s step with the step (one prepared read) and build its result."""
    alias = run._state.db or DEFAULT_DB_ALIAS
    params = {
        "run_id": WorkflowRun._meta.pk.get_db_prep_value(run.pk, connections[alias]),
        "step_name": TASK_STEP,
    }
    with hot_cursor(connections[alias]) as cursor:
        cursor.execute(sql.statement("attempts_of_step", connections[alias]), params)
        rows, description = cursor.fetchall(), cursor.description
    # The attempt's columns, then the step's (``step__*``).
    split = next(i for i, column in enumerate(description) if column[0].startswith("step__"))
    own, steps = description[:split], [(c[0].removeprefix("step__"), *c[1:]) for c in description[split:]]
    attempts = [model_from_row(WorkflowStepAttempt, alias, own, row[:split]) for row in rows]
    # A step not yet claimed has no attempt row: it is READY, whatever else it says.
    step = model_from_row(WorkflowStep, alias, steps, rows[0][split:]) if rows else None
    return build_result(task, backend, run, step, attempts, now_ms)


def task_is_unfinished(path: str, result_id: str) -> bool:
    """Is the result ``result_id`` of the task at ``path`` still ready or running? False once it is gone."""
    try:
        status = resolve_task(path).get_result(result_id).status
    except (TaskResultDoesNotExist, NotImplementedError):
        return False
    return status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)
