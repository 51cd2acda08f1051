"""
``PikkuTaskBackend``: Django's Tasks framework on durable workflow runs.
This module imports no model: Django builds the backend while apps may still
be loading (an app whose ``__init__`` or ``AppConfig`` imports its ``@task``
functions); what touches the models is ``tasks.stored``, imported at first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.utils.module_loading import autodiscover_modules

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError, PikkuConfigurationError
from pikku_django.policy import StepPolicy, dump_policy, step_policy
from pikku_django.tasks.compat import BaseTaskBackend, Task, TaskResult
from pikku_django.tasks.options import check_task_options, make_task

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

#: ``wait()``'s timeout: ``workflows.results.DEFAULT_RESULT_TIMEOUT_MS``, which
#: this module cannot import (that module imports the models).
RESULT_TIMEOUT_MS = 30_000

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
        self.worker_losses: int = OPTION_DEFAULTS["worker_losses"]
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
        worker inserts the step itself, with the same budget.
        """
        if self.options_error is not None:
            raise PikkuConfigurationError(self.options_error)
        if not isinstance(task, Task):
            raise InvalidArgumentError(f"task must be a Task (a @task function), not {type(task).__name__}.")
        self.validate_task(task)
        return _stored().enqueue(self, task, args, kwargs)  # type: ignore[no-any-return]

    def stored_input(
        self, task: Task[Any, Any], args: Any, kwargs: Any, run_after_ms: int | None
    ) -> tuple[dict[str, Any], int, int]:
        """
        The input of the task's run, and its step's ``retries`` and
        ``worker_losses``: the input carries the budget too, for a worker
        that inserts the step itself.
        """
        retries, worker_losses, policy = self._policy(task)
        stored = {
            "task": task.module_path,
            "backend": self.alias,
            "args": args,
            "kwargs": kwargs,
            "retries": retries,
            "worker_losses": worker_losses,
            "lease_ms": self.lease_ms,
            "run_after_ms": run_after_ms,
        }
        if policy is not None:
            # Read by the worker that runs it (``runner.run_task``); none stored: judged as before.
            stored["policy"] = dump_policy(policy)
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
        return _stored().get_result(self, result_id)  # type: ignore[no-any-return]

    def wait(self, result_id: str, timeout_ms: int = RESULT_TIMEOUT_MS) -> TaskResult[Any, Any]:
        """
        The task's result once it has finished (succeeded or failed for
        good), waited for on the database clock as ``wait_for_result`` does;
        ``ResultTimeoutError`` naming ``result_id`` once ``timeout_ms`` has passed.
        """
        return _stored().wait(self, result_id, timeout_ms)  # type: ignore[no-any-return]


def _stored() -> ModuleType:
    """
    ``pikku_django.tasks.stored``, what stores and reads tasks: imported by
    name at first use, because it imports the models, and Django builds this
    backend (a ``@task`` module asks it for its ``task_class``) while apps
    may still be loading, before any model can be imported.
    """
    return importlib.import_module("pikku_django.tasks.stored")
