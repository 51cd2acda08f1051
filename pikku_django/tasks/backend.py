"""``PikkuTaskBackend``: Django's Tasks framework on durable workflow runs."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import router, transaction

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.errors import InvalidArgumentError, PikkuConfigurationError
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.tasks.compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from pikku_django.tasks.results import (
    TASK_STEP,
    TASK_WORKFLOW,
    build_result,
    epoch_ms,
    from_epoch_ms,
    read_result,
    resolve_task,
)

#: The OPTIONS this backend reads, with their defaults.
OPTION_DEFAULTS: dict[str, Any] = {"retries": 0, "lease_ms": None, "worker_losses": 2}


class PikkuTaskBackend(BaseTaskBackend):
    """
    Stores each enqueued task as a workflow run (one step: the task's own
    function) that ``manage.py pikku_worker`` drives under a step lease: a
    task whose worker dies runs again as a new attempt, never stuck RUNNING.
    ``run_after`` and the lease are judged on the database clock.

    ``OPTIONS``: ``retries`` (attempts after the first that raised; default
    0), ``worker_losses`` (lost workers a task outlives, each followed by a
    new attempt, before one more fails it; default 2) and ``lease_ms`` (the
    step lease; default ``PIKKU_STEP_LEASE_MS``).
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        if unknown:
            raise PikkuConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown options {unknown}; "
                f"PikkuTaskBackend reads {sorted(OPTION_DEFAULTS)}."
            )
        options = {**OPTION_DEFAULTS, **self.options}
        try:
            self.retries = validate.whole("retries", options["retries"])
            self.worker_losses = validate.whole("worker_losses", options["worker_losses"])
            self.lease_ms = (
                None if options["lease_ms"] is None else validate.positive_ms("lease_ms", options["lease_ms"])
            )
        except InvalidArgumentError as e:
            raise PikkuConfigurationError(f"TASKS[{alias!r}]['OPTIONS']: {e}") from None

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """
        Store the task as a run due at ``run_after`` (or now), with its one
        step. The rows are written on the caller's connection, in one
        transaction: inside ``transaction.atomic()`` they commit or roll back
        with the caller's own writes.
        """
        if not isinstance(task, Task):
            raise InvalidArgumentError(f"task must be a Task (a @task function), not {type(task).__name__}.")
        self.validate_task(task)
        # The worker finds the function again by this path, and only if it names a Task.
        resolve_task(task.module_path)
        try:
            stored_args, stored_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"args and kwargs must be JSON-serialisable: {e}") from None
        run_after_ms = None if task.run_after is None else epoch_ms(task.run_after)
        alias = router.db_for_write(WorkflowRun)
        with transaction.atomic(using=alias):
            run = WorkflowRun.objects.db_manager(alias).create_run(
                TASK_WORKFLOW,
                {
                    "task": task.module_path,
                    "backend": self.alias,
                    "args": stored_args,
                    "kwargs": stored_kwargs,
                    "retries": self.retries,
                    "lease_ms": self.lease_ms,
                    "run_after_ms": run_after_ms,
                },
                queue=task.queue_name,
                priority=task.priority,
                wake_at=run_after_ms,
            )
            # Stored now, so that a worker only claims it.
            step = WorkflowStep.objects.db_manager(alias).insert_step(
                run, TASK_STEP, task.module_path, retries=self.retries, worker_losses=self.worker_losses
            )
        result = build_result(task, self.alias, run, step, [], now_ms=0)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id."""
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
        return read_result(task, str(stored.get("backend", self.alias)), run, run.db_now_ms)
