"""
A task stored as a run, and read back: what ``PikkuTaskBackend`` does with
the models (enqueue's two INSERTs, a result's read, a wait). The backend
module imports none of this at import time, since Django builds a backend
(and a ``@task`` module imports one) while apps may still be loading.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, router

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.errors import TaskArgumentsError
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.tasks.compat import Task, TaskResult, TaskResultDoesNotExist, normalize_json, task_enqueued
from pikku_django.tasks.results import (
    TASK_STEP,
    TASK_WORKFLOW,
    build_result,
    epoch_ms,
    from_epoch_ms,
    read_result,
    resolve_task,
)
from pikku_django.workflows import tracing
from pikku_django.workflows.results import wait_for_result

if TYPE_CHECKING:
    from pikku_django.tasks.backend import PikkuTaskBackend


def enqueue(backend: PikkuTaskBackend, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
    """``PikkuTaskBackend.enqueue`` once the task itself is checked: its run and its one step stored."""
    # The worker finds the function again by this path, and only if it names a Task.
    resolve_task(task.module_path)
    try:
        stored_args, stored_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
    except (TypeError, ValueError) as e:
        raise TaskArgumentsError(f"args and kwargs must be JSON-serialisable: {e}") from None
    validate.json_value("args", {"args": stored_args, "kwargs": stored_kwargs}, not_json=TaskArgumentsError)
    run_after_ms = None if task.run_after is None else epoch_ms(task.run_after)
    stored, retries, worker_losses = backend.stored_input(task, stored_args, stored_kwargs, run_after_ms)
    alias = router.db_for_write(WorkflowRun)
    with tracing.enqueue(task.module_path, task.queue_name) as traced:
        run = WorkflowRun.objects.db_manager(alias).create_run(
            TASK_WORKFLOW,
            stored,
            queue=task.queue_name,
            priority=task.priority,
            wake_at=run_after_ms,
            internal=True,
            trace_context=traced.context,
        )
        traced.started(run)
    # Stored now, so that a worker only claims it.
    try:
        WorkflowStep.objects.db_manager(alias).insert_pending(
            run,
            TASK_STEP,
            task.module_path,
            retries=retries,
            worker_losses=worker_losses,
            deferred=run_after_ms is not None,
        )
    except IntegrityError:
        if connections[alias].in_atomic_block:
            raise
        # In autocommit the run was due once its INSERT committed, and a
        # worker took it and inserted the step itself, with the budget the
        # run's input carries: the task is stored (and running), as it would
        # be had this INSERT come first.
    result = build_result(task, backend.alias, run, None, [], now_ms=0)
    task_enqueued.send(type(backend), task_result=result)
    return result


def get_result(backend: PikkuTaskBackend, result_id: str) -> TaskResult[Any, Any]:
    """``PikkuTaskBackend.get_result``: the task's result as stored now."""
    try:
        pk = uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None
    try:
        run = WorkflowRun.objects.annotate(db_now_ms=DbNowMs()).get(pk=pk, workflow=TASK_WORKFLOW)
    except (WorkflowRun.DoesNotExist, ValidationError):
        raise TaskResultDoesNotExist(result_id) from None
    stored = run.input or {}
    task = resolve_task(stored.get("task")).using(queue_name=run.queue, priority=run.priority)
    if stored.get("run_after_ms") is not None:
        task = task.using(run_after=from_epoch_ms(stored["run_after_ms"]))
    return read_result(task, str(stored.get("backend", backend.alias)), run, run.db_now_ms)


def wait(backend: PikkuTaskBackend, result_id: str, timeout_ms: int) -> TaskResult[Any, Any]:
    """``PikkuTaskBackend.wait``: the result once finished."""
    get_result(backend, result_id)
    wait_for_result(result_id, timeout_ms)
    return get_result(backend, result_id)


__all__ = ["enqueue", "get_result", "wait"]
