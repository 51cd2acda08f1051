"""
An attempt with a ``timeout_ms``: its function runs in a thread of its own
while the lane waits for it until the deadline, judged from the attempt's
start on the database clock (its history row's ``running_at``). At the
deadline ``StepTimeoutError`` (``TaskTimeoutError`` for a task) is raised
in that thread, or its coroutine is cancelled; the lane waits at most
``PIKKU_TIMEOUT_GRACE_MS`` more for the function to end, then leaves it and
records the attempt as failed by its timeout: whatever the function returns
later goes nowhere, and its attempt's fence refuses any outcome of it.

A thread that ignores the exception cannot be stopped: it keeps running in
the process. A worker keeps at most ``PIKKU_TIMEOUT_MAX_ABANDONED`` of them;
reaching that, it stops as on SIGTERM, so that its supervisor starts a
fresh process.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

from pikku_django.clock import DbNowMs, EpochMs
from pikku_django.conf import conf
from pikku_django.errors import StepTimeoutError
from pikku_django.models import WorkflowStepAttempt

logger = logging.getLogger(__name__)

_local = threading.local()

#: Threads whose attempt timed out and that did not end within the grace.
_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()


def abandoned() -> int:
    """How many threads of timed-out attempts still run in this process."""
    with _abandoned_lock:
        _abandoned[:] = [thread for thread in _abandoned if thread.is_alive()]
        return len(_abandoned)


def remaining_s() -> float | None:
    """Seconds left to the attempt this thread runs, or None without a timeout."""
    deadline: float | None = getattr(_local, "deadline", None)
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def await_within(awaitable: Awaitable[Any]) -> Any:
    """
    The result of ``awaitable`` on an event loop of its own; within an
    attempt with a timeout, cancelled at its deadline (``StepTimeoutError``).
    """
    # Read here, in the attempt's thread: the coroutine runs on the loop's.
    left = remaining_s()
    timeout_error: Callable[[], StepTimeoutError] = getattr(_local, "error", StepTimeoutError)

    async def wait() -> Any:
        if left is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, left)
        except asyncio.TimeoutError:
            raise timeout_error() from None

    return async_to_sync(wait)()


def attempt_deadline_s(step_id: Any, attempt: int, timeout_ms: int, using: str) -> float:
    """
    Seconds from now to the attempt's deadline: its start (``running_at``) on
    the database clock plus ``timeout_ms``, less the database's now (one read).
    """
    found = (
        WorkflowStepAttempt.objects.db_manager(using)
        .filter(step_id=step_id, attempt=attempt, running_at__isnull=False)
        .annotate(started=EpochMs("running_at"), now=DbNowMs())
        .values_list("started", "now")
        .first()
    )
    if found is None:
        return timeout_ms / 1000
    started_ms, now_ms = int(found[0]), int(found[1])
    return max(started_ms + timeout_ms - now_ms, 0) / 1000


class _Attempt(threading.Thread):
    """The thread an attempt with a timeout runs its function in."""

    def __init__(
        self, call: Callable[[], Any], deadline: float, error: Callable[[], StepTimeoutError]
    ) -> None:
        super().__init__(name="pikku-attempt", daemon=True)
        self._call = call
        self._context = contextvars.copy_context()
        self._deadline = deadline
        self._error = error
        self.done = threading.Event()
        self.result: Any = None
        self.raised: BaseException | None = None

    def run(self) -> None:
        _local.deadline, _local.error = self._deadline, self._error
        try:
            self.result = self._context.run(self._call)
        except BaseException as error:  # noqa: BLE001 - the attempt's error, whatever it is
            self.raised = error
        finally:
            self.done.set()
            # This thread's own connections, if the function opened any.
            connections.close_all()


def _raise_in(thread: threading.Thread, error: type[BaseException]) -> None:
    """Raise ``error`` in ``thread`` at its next Python instruction."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(error))


def run_within(
    call: Callable[[], Any],
    seconds: float,
    error: Callable[[], StepTimeoutError],
    stop: threading.Event | None = None,
) -> Any:
    """
    ``call()``'s result, run in a thread of its own for at most ``seconds``;
    past them ``error()`` is raised here (and in that thread). A thread that
    does not end within the grace is left running (``abandoned``); once
    ``PIKKU_TIMEOUT_MAX_ABANDONED`` are, ``stop`` (the worker's) is set.
    """
    thread = _Attempt(call, time.monotonic() + seconds, error)
    thread.start()
    if thread.done.wait(seconds):
        if thread.raised is not None:
            raise thread.raised
        return thread.result
    timeout = error()
    # The class, so the thread's exception carries no state of the lane's.
    _raise_in(thread, type(timeout))
    if not thread.done.wait(conf.TIMEOUT_GRACE_MS / 1000):
        with _abandoned_lock:
            _abandoned.append(thread)
        count = abandoned()
        logger.warning(
            "%s Its function ignored it and still runs (%s such threads in this process).", timeout, count
        )
        if count >= conf.TIMEOUT_MAX_ABANDONED and stop is not None and not stop.is_set():
            logger.error(
                "%s threads of timed-out attempts still run in this process: the worker stops, "
                "so that a fresh process takes its place.",
                count,
            )
            stop.set()
    raise timeout


__all__ = ["abandoned", "attempt_deadline_s", "await_within", "remaining_s", "run_within"]
