"""Errors of Django Tasks run by the backend."""

from __future__ import annotations

from pikku_django.errors.base import InvalidArgumentError
from pikku_django.errors.steps import StepTimeoutError


class TaskArgumentsError(InvalidArgumentError, TypeError):
    """
    A task's arguments are not JSON: a ``TypeError``, as Django's Tasks
    framework raises for them, and a ``PikkuError``.
    """


class TaskPathError(InvalidArgumentError):
    """A stored task path does not name a ``Task``; it is refused, never called."""

    def __init__(self, path: str, reason: str, *, missing: bool = False) -> None:
        self.path = path
        #: Nothing is found at the path (a typo, a module not installed here), as opposed to something else.
        self.missing = missing
        super().__init__(
            f"task: {path!r} does not name a Task ({reason}); only a function decorated "
            "with @task, defined at module level, is run."
        )


class TaskTimeoutError(StepTimeoutError):
    """A Django task's attempt ran past its ``timeout_ms``: a ``StepTimeoutError``."""
