"""A running task's progress: an event of its run, read with ``get_event(result_id, "progress")``."""

from __future__ import annotations

import importlib
from typing import Any

from pikku_django.errors import PikkuError

#: The event key a task's progress is kept under.
PROGRESS_KEY = "progress"


def set_progress(value: Any) -> None:
    """
    Report the running task's progress (any JSON ``value``; the last one
    counts), fenced to its attempt: a superseded attempt raises
    ``StepSupersededError`` and writes nothing. Also works in a workflow's step.
    """
    # By name at call time: ``pikku_django.tasks`` exports this function, and
    # that package is imported while apps load, before the workflows (and the
    # models they import) can be.
    step = importlib.import_module("pikku_django.workflows.current").current_step()
    if step is None:
        raise PikkuError("set_progress() reports the progress of a running task: call it inside the task.")
    step.set_event(PROGRESS_KEY, value)


__all__ = ["PROGRESS_KEY", "set_progress"]
