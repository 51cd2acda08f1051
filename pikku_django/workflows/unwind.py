"""
What unwinds a workflow function on the runtime's behalf, never a step's
error: ``Suspend`` (this pass can go no further now), ``Stop`` (this pass is
stale), and the store's errors under a ``ctx`` method (``StoreFailure``,
see ``unwinds_store_errors``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import Error as DatabaseError_

from pikku_django.errors import StoreFailure, WorkerAbortedError, WorkflowReplayError


class Suspend(BaseException):
    """
    Unwinds the workflow function: this pass can go no further now. The run is
    woken again at ``wake_at`` (epoch ms on the DB clock), or not at all (None)
    until something wakes it. ``status`` is the run's status meanwhile
    (``suspended`` while it waits for a signal). ``recheck``, if given, is
    asked once the suspension is written whether what the run waits for came
    meanwhile (then it is woken at once), so a wake sent while the pass was
    suspending is never lost. A BaseException, so that a workflow's own
    ``except Exception`` cannot swallow it.
    """

    def __init__(
        self,
        wake_at: int | None,
        reason: str,
        *,
        status: str = "running",
        recheck: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(reason)
        self.wake_at = wake_at
        self.reason = reason
        self.status = status
        self.recheck = recheck


class Stop(BaseException):
    """Unwinds the workflow function: this pass is stale and must write nothing more."""


#: What unwinds a workflow function on the runtime's behalf; never a step's error.
PASS_CONTROL: tuple[type[BaseException], ...] = (Suspend, Stop, StoreFailure, WorkerAbortedError)

F = TypeVar("F", bound=Callable[..., Any])


def unwinds_store_errors(method: F, *, flushes: bool = True) -> F:
    """
    A ``ctx`` method that uses the store: it first commits the step success
    the pass still holds (``RunContext.flush_outcome``), so the store sees
    every step that ended before the call; and its database errors unwind
    the workflow function as ``StoreFailure`` (a BaseException), so the
    workflow's own ``except Exception`` never takes a database blip for a
    step's outcome. ``flushes=False``: the method commits the held success
    itself (see ``commits_held_outcome``).
    """

    @functools.wraps(method)
    def wrapper(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        met = getattr(ctx, "replay_error", None)
        if met is not None:
            # The history no longer fits: nothing more of this pass runs.
            raise met
        try:
            flush = getattr(ctx, "flush_outcome", None) if flushes else None
            if flush is not None:
                flush()
            return method(ctx, *args, **kwargs)
        except DatabaseError_ as error:
            raise StoreFailure(error) from error
        except WorkflowReplayError as error:
            if hasattr(ctx, "replay_error"):
                # Kept, so a workflow that catches it still ends its pass on it (``runner``).
                ctx.replay_error = error
            raise

    return wrapper  # type: ignore[return-value]


def commits_held_outcome(method: F) -> F:
    """``unwinds_store_errors`` for ``ctx.step``, which commits the held success with a new step's start."""
    return unwinds_store_errors(method, flushes=False)
