"""What a step function can see of the step it runs for: ``current_step()``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pikku_django import validate
from pikku_django.errors import WorkflowCancelledError
from pikku_django.store.events import publish_of_attempt, set_event_of_attempt

_local = threading.local()


class StepHandle:
    """
    The step a function runs for. ``cancelled`` is set the moment the step's
    lease renewal answers "not yours": its run was cancelled or timed out, or
    another attempt took the step over. Either way its result will be refused,
    so a long step may stop early (``check()`` raises ``WorkflowCancelledError``).
    ``publish`` and ``set_event`` write to the run's streams and events,
    fenced to this attempt: once another attempt owns the step (or a cancel
    fenced it), they raise ``StepSupersededError`` and write nothing.
    """

    def __init__(
        self,
        run_id: Any,
        step_name: str,
        attempt: int,
        cancelled: threading.Event,
        *,
        step_id: Any = None,
        using: str = "default",
    ) -> None:
        self.run_id = run_id
        self.step_name = step_name
        self.attempt = attempt
        self.cancelled = cancelled
        self.step_id = step_id
        self.using = using

    def check(self) -> None:
        """Raise ``WorkflowCancelledError`` once the step's result can no longer count."""
        if self.cancelled.is_set():
            raise WorkflowCancelledError(self.run_id)

    def publish(self, stream: str, item: Any) -> int:
        """Append ``item`` (JSON) to the run's ``stream`` while this attempt is live; its offset."""
        validate.name("stream", stream)
        validate.json_value("item", item)
        return publish_of_attempt(self.using, self.run_id, self.step_id, self.attempt, stream, item)

    def set_event(self, key: str, value: Any) -> None:
        """Make ``value`` (JSON) the run's event ``key`` while this attempt is live."""
        validate.name("key", key)
        validate.json_value("value", value)
        set_event_of_attempt(self.using, self.run_id, self.step_id, self.attempt, key, value)


def current_step() -> StepHandle | None:
    """The step whose function this thread is running, or None outside a step."""
    handle: StepHandle | None = getattr(_local, "handle", None)
    return handle


@contextmanager
def running_step(handle: StepHandle) -> Iterator[StepHandle]:
    """Make ``handle`` the current step while the step function runs."""
    outer = getattr(_local, "handle", None)
    _local.handle = handle
    try:
        yield handle
    finally:
        _local.handle = outer
