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
from pikku_django.errors import InvalidArgumentError, TaskArgumentsError
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.store.debounce import start_debounced
from pikku_django.store.dedup import start_deduplicated
from pikku_django.tasks.compat import Task, TaskResult, TaskResultDoesNotExist, normalize_json, task_enqueued
from pikku_django.tasks.flow import collect_call, flow_arguments, fold_calls
from pikku_django.tasks.options import task_flow
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
    """
    ``PikkuTaskBackend.enqueue`` once the task itself is checked: its run
    and its one step stored. The task's flow options (``key``,
    ``dedup_key``, ``debounce_ms``, ...; ``tasks.flow``) are filled from this
    call's arguments; a call deduplicated or debounced into a run stored
    before gets that run's result (and sends no ``task_enqueued``).
    """
    # The worker finds the function again by this path, and only if it names a Task.
    resolve_task(task.module_path)
    try:
        stored_args, stored_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
    except (TypeError, ValueError) as e:
        raise TaskArgumentsError(f"args and kwargs must be JSON-serialisable: {e}") from None
    validate.json_value("args", {"args": stored_args, "kwargs": stored_kwargs}, not_json=TaskArgumentsError)
    flow, stored_args, stored_kwargs = _flow(task, args, kwargs, stored_args, stored_kwargs)
    run_after_ms = None if task.run_after is None else epoch_ms(task.run_after)
    stored, retries, worker_losses = backend.stored_input(task, stored_args, stored_kwargs, run_after_ms)
    alias = router.db_for_write(WorkflowRun)
    with tracing.enqueue(task.module_path, task.queue_name) as traced:
        run, new = _start(alias, task, stored, flow, run_after_ms, traced.context)
        traced.started(run)
    if not new:
        # Deduplicated or debounced into a run stored before: its result as it stands.
        return get_result(backend, str(run.pk))
    # Stored now, so that a worker only claims it.
    try:
        WorkflowStep.objects.db_manager(alias).insert_pending(
            run,
            TASK_STEP,
            task.module_path,
            retries=retries,
            worker_losses=worker_losses,
            deferred=run_after_ms is not None or "debounce_ms" in flow,
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


def _flow(
    task: Task[Any, Any], args: Any, kwargs: Any, stored_args: Any, stored_kwargs: Any
) -> tuple[dict[str, Any], Any, Any]:
    """
    The flow arguments of this call of ``task`` (``tasks.flow``), and the
    arguments to store: for a debounced task in ``"collect"`` mode, one
    argument, the list of calls (this call alone until others join it).
    """
    flow = flow_arguments(task_flow(task), list(args), dict(kwargs), task.module_path)
    if "debounce_ms" in flow and task.run_after is not None:
        raise InvalidArgumentError("a debounced task cannot be given run_after: its burst says when it runs.")
    if "debounce_ms" in flow and flow.get("debounce_mode") == "collect":
        return flow, [[collect_call(stored_args, stored_kwargs)]], {}
    return flow, stored_args, stored_kwargs


def _start(
    alias: str,
    task: Task[Any, Any],
    stored: dict[str, Any],
    flow: dict[str, Any],
    run_after_ms: int | None,
    trace_context: dict[str, str] | None,
) -> tuple[WorkflowRun, bool]:
    """
    The task's run, and whether this call stored it: a new run, or under the
    task's flow options (``tasks.flow``) the run its ``dedup_key`` holds
    (or ``DuplicateRunError``) or the open run of its debounced ``key``.
    """
    runs = WorkflowRun.objects.db_manager(alias)
    made: list[WorkflowRun] = []

    def create(value: Any = stored, wake_at: int | None = run_after_ms, until: int | None = None) -> Any:
        run = runs.create_run(
            TASK_WORKFLOW,
            value,
            queue=task.queue_name,
            priority=task.priority,
            wake_at=wake_at,
            internal=True,
            trace_context=trace_context,
            key=flow.get("key"),
            dedup_key=flow.get("dedup_key"),
            debounce_until=until,
        )
        made.append(run)
        return run

    if "debounce_ms" in flow:
        mode = flow.get("debounce_mode", "last")
        run = start_debounced(
            alias,
            TASK_WORKFLOW,
            flow["key"],
            stored,
            debounce_ms=flow["debounce_ms"],
            debounce_max_ms=flow.get("debounce_max_ms"),
            mode=mode,
            create=create,
            fold=fold_calls if mode == "collect" else None,
            among={"input__task": task.module_path},
        )
    elif flow.get("dedup_key") is not None:
        run = start_deduplicated(alias, create, TASK_WORKFLOW, flow["dedup_key"], flow.get("dedup", "return"))
    else:
        run = create()
    return run, bool(made) and made[-1] is run


__all__ = ["enqueue", "get_result", "wait"]
