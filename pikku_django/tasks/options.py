"""
A task's own options: ``@task(max_attempts=6, ...)`` on Django 6.1 (and the
``django_tasks`` backport, whose ``task()`` passes extra keyword arguments
to the backend's ``task_class``), or ``@options(...)`` above ``@task()`` on
every version. Each value is validated when given (a ``ValueError`` naming
it); a name this app does not know is kept and reported by the system check
``pikku_django.E040``, naming the task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.core.checks import CheckMessage, Error

from pikku_django.policy import POLICY_OPTIONS, StepPolicy, step_policy
from pikku_django.tasks.compat import Task
from pikku_django.tasks.flow import check_flow_options

#: The options of flow control a task may carry too (per key: concurrency,
#: rate, dedup, debounce), read by that part of the app.
FLOW_OPTIONS = frozenset({"key", "dedup_key", "dedup", "debounce_ms", "debounce_max_ms", "debounce_mode"})

#: Every option name a task may be given.
TASK_OPTIONS = POLICY_OPTIONS | FLOW_OPTIONS

#: The id of the check that names a task's unknown options.
UNKNOWN_OPTIONS_CHECK_ID = "pikku_django.E040"

#: Tasks made with options this app does not know: (task path, sorted names).
_UNKNOWN: dict[str, list[str]] = {}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PikkuTask(Task):  # type: ignore[type-arg]
    """A ``Task`` with this backend's options (name and value pairs)."""

    options: tuple[tuple[str, Any], ...] = ()

    @property
    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)


def task_flow(task: Task[Any, Any]) -> dict[str, Any]:
    """The flow-control options a task was given (``tasks.flow``), by name."""
    return {name: value for name, value in getattr(task, "options", ()) if name in FLOW_OPTIONS}


def task_policy(task: Task[Any, Any]) -> StepPolicy | None:
    """The policy a task's own options give (None without any)."""
    options = dict(getattr(task, "options", ()))
    return step_policy(**{name: value for name, value in options.items() if name in POLICY_OPTIONS})


def _checked(path: str, options: dict[str, Any], *, whole: bool = True) -> tuple[tuple[str, Any], ...]:
    """
    ``options`` with their values validated now; unknown names kept for the
    system check. ``whole``: these are all the task's options, so the flow
    options that need one another are checked together too.
    """
    step_policy(**{name: value for name, value in options.items() if name in POLICY_OPTIONS})
    check_flow_options(options, together=whole)
    unknown = sorted(set(options) - TASK_OPTIONS)
    if unknown:
        _UNKNOWN[path] = unknown
    return tuple(sorted(options.items()))


def _path(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def make_task(**kwargs: Any) -> PikkuTask:
    """
    The backend's ``task_class``: what ``task(...)`` builds, the framework's
    arguments as a ``Task`` takes them and every other one an option.
    """
    fields = {field.name for field in dataclasses.fields(Task)}
    base = {name: value for name, value in kwargs.items() if name in fields}
    options = {name: value for name, value in kwargs.items() if name not in fields}
    return PikkuTask(**base, options=_checked(_path(base["func"]), options))


def options(**given: Any) -> Callable[[Task[Any, Any]], PikkuTask]:
    """
    ``@options(max_attempts=6, timeout_ms=30_000)`` above ``@task()``: the
    task with these options (over any it has), on every Django version.
    """
    checked = _checked("", given, whole=False)
    _UNKNOWN.pop("", None)

    def decorate(task: Task[Any, Any]) -> PikkuTask:
        if not isinstance(task, Task):
            raise TypeError(f"options() decorates a @task, not {type(task).__name__}; put it above @task().")
        merged = {**dict(getattr(task, "options", ())), **dict(checked)}
        base = {field.name: getattr(task, field.name) for field in dataclasses.fields(Task)}
        return PikkuTask(**base, options=_checked(_path(task.func), merged))

    return decorate


def check_task_options(**kwargs: Any) -> list[CheckMessage]:
    """``pikku_django.E040``: every task made with an option name this app does not know."""
    return [
        Error(
            f"Task {path!r} has unknown options {names}.",
            hint=f"A task's options are {sorted(TASK_OPTIONS)}.",
            obj=path,
            id=UNKNOWN_OPTIONS_CHECK_ID,
        )
        for path, names in sorted(_UNKNOWN.items())
    ]


__all__ = [
    "FLOW_OPTIONS",
    "TASK_OPTIONS",
    "PikkuTask",
    "check_task_options",
    "make_task",
    "options",
    "task_flow",
    "task_policy",
]
