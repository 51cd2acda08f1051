"""``PikkuTaskBackend``: Django's Tasks framework on durable workflow runs."""

from __future__ import annotations

import uuid
from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, router
from django.utils.module_loading import autodiscover_modules

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.errors import InvalidArgumentError, PikkuConfigurationError, TaskArgumentsError
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.policy import StepPolicy, dump_policy, step_policy
from pikku_django.store.debounce import start_debounced
from pikku_django.store.dedup import start_deduplicated
from pikku_django.tasks.compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from pikku_django.tasks.flow import collect_call, flow_arguments, fold_calls
from pikku_django.tasks.options import check_task_options, make_task, task_flow
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
from pikku_django.workflows.results import DEFAULT_RESULT_TIMEOUT_MS, wait_for_result

#: The OPTIONS this backend reads, with their defaults: ``retries``,
#: ``worker_losses`` and ``lease_ms``, and the defaults of a task's policy
#: options (``max_attempts``, ``backoff``, ``retry_on``, ``timeout_ms``), which
#: a task's own options override one by one.
OPTION_DEFAULTS: dict[str, Any] = {
    "retries": 0,
    "lease_ms": None,
    "worker_losses": 2,
    "max_attempts": None,
    "backoff": None,
    "retry_on": None,
    "timeout_ms": None,
}

#: The OPTIONS that are defaults of a task's policy.
POLICY_DEFAULTS = ("max_attempts", "backoff", "retry_on", "timeout_ms")

#: The check ids of ``PikkuTaskBackend.check()``.
NOT_INSTALLED_CHECK_ID = "pikku_django.E020"
OPTIONS_CHECK_ID = "pikku_django.E021"


def _read_options(options: Any) -> tuple[int, int, int | None]:
    """(retries, worker_losses, lease_ms) from OPTIONS, or InvalidArgumentError naming what is wrong."""
    if not isinstance(options, dict):
        raise InvalidArgumentError(f"must be a dict, not {type(options).__name__}.")
    unknown = sorted(set(options) - set(OPTION_DEFAULTS), key=str)
    if unknown:
        raise InvalidArgumentError(f"unknown options {unknown}.")
    options = {**OPTION_DEFAULTS, **options}
    retries = validate.retries("retries", options["retries"])
    worker_losses = validate.retries("worker_losses", options["worker_losses"])
    # Their values are checked here, as a task's own are when given.
    step_policy(**{name: options[name] for name in POLICY_DEFAULTS})
    lease_ms = None if options["lease_ms"] is None else validate.positive_ms("lease_ms", options["lease_ms"])
    return retries, worker_losses, lease_ms


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
    # A coroutine task runs in its lane (Task.call drives it), its lease renewed while it awaits.
    supports_async_task = True
    # What task(...) builds: a Task with this backend's options (``tasks.options``).
    task_class = staticmethod(make_task)  # type: ignore[assignment]

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Bad OPTIONS never raise here (Django builds every backend to check
        # it): check() reports them, and enqueue() refuses to store a task.
        self.retries, self.lease_ms = OPTION_DEFAULTS["retries"], OPTION_DEFAULTS["lease_ms"]
        self.options_error: str | None = None
        try:
            self.retries, self.worker_losses, self.lease_ms = _read_options(self.options)
        except InvalidArgumentError as e:
            self.options_error = f"TASKS[{alias!r}]['OPTIONS']: {e}"

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """``pikku_django`` must be installed (its tables store the tasks), and OPTIONS valid."""
        messages: list[CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("pikku_django"):
            messages.append(
                Error(
                    f"TASKS[{self.alias!r}] uses PikkuTaskBackend, "
                    "but 'pikku_django' is not in INSTALLED_APPS.",
                    hint="Add 'pikku_django' to INSTALLED_APPS and run migrate: its tables store the tasks.",
                    id=NOT_INSTALLED_CHECK_ID,
                )
            )
        if self.options_error is not None:
            messages.append(
                Error(
                    self.options_error,
                    hint=f"PikkuTaskBackend reads OPTIONS {sorted(OPTION_DEFAULTS)}: retries, "
                    "an int >= 0, lease_ms, None or an int of milliseconds > 0, and the "
                    "defaults of a task's policy options (see docs/policies.md).",
                    id=OPTIONS_CHECK_ID,
                )
            )
        # Every installed app's tasks module, imported as the admin imports
        # admin.py, so that each task's options are known here.
        autodiscover_modules("tasks")
        messages.extend(check_task_options())
        return messages

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """
        Store the task as a run due at ``run_after`` (or now), with its one
        step: two INSERTs on the caller's connection, nothing read back.
        Inside ``transaction.atomic()`` they commit or roll back with the
        caller's own writes; outside, a crash between them leaves a run whose
        worker inserts the step itself. The task's flow options (``key``,
        ``dedup_key``, ``debounce_ms``, ...; ``tasks.flow``) are filled from
        this call's arguments; a call deduplicated or debounced into a run
        stored before gets that run's result (and sends no ``task_enqueued``).
        """
        if self.options_error is not None:
            raise PikkuConfigurationError(self.options_error)
        if not isinstance(task, Task):
            raise InvalidArgumentError(f"task must be a Task (a @task function), not {type(task).__name__}.")
        self.validate_task(task)
        # The worker finds the function again by this path, and only if it names a Task.
        resolve_task(task.module_path)
        try:
            stored_args, stored_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except (TypeError, ValueError) as e:
            raise TaskArgumentsError(f"args and kwargs must be JSON-serialisable: {e}") from None
        validate.json_value(
            "args", {"args": stored_args, "kwargs": stored_kwargs}, not_json=TaskArgumentsError
        )
        flow, stored_args, stored_kwargs = _flow(task, args, kwargs, stored_args, stored_kwargs)
        run_after_ms = None if task.run_after is None else epoch_ms(task.run_after)
        stored, retries, worker_losses = self._stored(task, stored_args, stored_kwargs, run_after_ms)
        alias = router.db_for_write(WorkflowRun)
        with tracing.enqueue(task.module_path, task.queue_name) as traced:
            run, new = _start(alias, task, stored, flow, run_after_ms, traced.context)
            traced.started(run)
        if not new:
            # Deduplicated or debounced into a run stored before: its result as it stands.
            return self.get_result(str(run.pk))
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
            # worker took it and inserted the step itself: the task is stored
            # (and running), as it would be had this INSERT come first.
        result = build_result(task, self.alias, run, None, [], now_ms=0)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _stored(
        self, task: Task[Any, Any], args: Any, kwargs: Any, run_after_ms: int | None
    ) -> tuple[dict[str, Any], int, int]:
        """The input of the task's run, and its step's ``retries`` and ``worker_losses``."""
        retries, worker_losses, policy = self._policy(task)
        stored = {
            "task": task.module_path,
            "backend": self.alias,
            "args": args,
            "kwargs": kwargs,
            "retries": retries,
            "lease_ms": self.lease_ms,
            "run_after_ms": run_after_ms,
        }
        if policy is not None:
            # Read by the worker that runs it (``runner.run_task``); none stored: judged as before.
            stored.update(worker_losses=worker_losses, policy=dump_policy(policy))
        return stored, retries, worker_losses

    def _policy(self, task: Task[Any, Any]) -> tuple[int, int, StepPolicy | None]:
        """
        (retries, worker_losses, policy) of ``task``: its own options over
        the backend's OPTIONS, one by one (the policy None without any).
        """
        given = {name: self.options.get(name) for name in POLICY_DEFAULTS}
        own = dict(getattr(task, "options", ()))
        given.update({name: own[name] for name in (*POLICY_DEFAULTS, "worker_losses") if name in own})
        policy = step_policy(**given)
        if policy is None:
            return self.retries, self.worker_losses, None
        if policy.worker_losses is None:
            policy.worker_losses = self.worker_losses
        retries, worker_losses = policy.budget(self.retries)
        assert retries is not None and worker_losses is not None
        return retries, worker_losses, policy

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

    def wait(self, result_id: str, timeout_ms: int = DEFAULT_RESULT_TIMEOUT_MS) -> TaskResult[Any, Any]:
        """
        The task's result once it has finished (succeeded or failed for
        good), waited for on the database clock as ``wait_for_result`` does;
        ``ResultTimeoutError`` naming ``result_id`` once ``timeout_ms`` has passed.
        """
        self.get_result(result_id)
        wait_for_result(result_id, timeout_ms)
        return self.get_result(result_id)


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
