"""Errors of a step's attempt: its lease lapsed, superseded, failed, timed out, or its worker lost."""

from __future__ import annotations

from typing import Any

from pikku_django.errors.base import PikkuError


class StepLeaseExpiredError(PikkuError):
    """A workflow step lost its worker on every one of its attempts."""

    def __init__(self, run_id: object, step_name: str, attempts: int) -> None:
        self.run_id = run_id
        self.step_name = step_name
        self.attempts = attempts
        super().__init__(
            f"Step {step_name!r} of run {run_id} lost its worker on every one of "
            f"its {attempts} attempts (its lease lapsed each time); it is failed "
            "rather than tried again."
        )


class StepSupersededError(PikkuError):
    """A newer attempt owns the step; this attempt's write was refused."""

    def __init__(self, step_id: object, attempt: int | None) -> None:
        self.step_id = step_id
        self.attempt = attempt
        super().__init__(
            f"Attempt {attempt} of step {step_id} was superseded: another attempt "
            "owns the step now, so this write was refused and nothing changed."
        )


class StepFailedError(PikkuError):
    """A workflow step failed on its last attempt; its error is ``error``."""

    def __init__(self, step_name: str, attempts: int, error: dict[str, object] | None) -> None:
        self.step_name = step_name
        self.attempts = attempts
        self.error = error or {}
        message = self.error.get("message", "unknown error")
        super().__init__(f"Step {step_name!r} failed on its last attempt ({attempts}): {message}")


class WorkerLostError(StepLeaseExpiredError):
    """
    An attempt's worker stopped renewing its step lease (it died, or lost the
    database): how the Tasks backend reports each such attempt in
    ``TaskResult.errors``, naming the worker (``holder``). A
    ``StepLeaseExpiredError``, so the last attempt of a task failed by its
    lost worker is both.
    """

    def __init__(self, run_id: object, step_name: str, attempt: int, holder: str, *, last: bool) -> None:
        self.run_id = run_id
        self.step_name = step_name
        self.attempts = self.attempt = attempt
        self.holder = holder
        then = (
            "it was the last attempt allowed, so the task failed"
            if last
            else "the task was taken again as a new attempt"
        )
        PikkuError.__init__(
            self,
            f"Attempt {attempt} ran on worker {holder or '(unnamed)'}, which stopped renewing its "
            f"step lease (it died or lost the database); {then}.",
        )


class RaisedBaseExceptionError(PikkuError):
    """
    Carries a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) out of a task's function as its attempt's error,
    so the worker records it and goes on. Stored as ``original``'s own type,
    message and traceback.
    """

    def __init__(self, original: BaseException) -> None:
        self.original = original
        super().__init__(f"{type(original).__name__}: {original}")


class NonRetryableError(PikkuError):
    """
    Raised by a step or a task: its attempt fails, and no other attempt is
    made, whatever its ``max_attempts``, ``retries`` or ``retry_on`` allow.
    """


class StepTimeoutError(PikkuError, TimeoutError):
    """
    An attempt of a step ran past its ``timeout_ms`` (judged from the
    attempt's start on the database clock): raised in the step's thread, or
    its coroutine cancelled. The attempt fails, and counts like any error.
    """

    def __init__(self, step_name: str = "", attempt: int = 0, timeout_ms: int = 0) -> None:
        # With no arguments: the one raised in the step's own thread.
        self.step_name, self.attempt, self.timeout_ms = step_name, attempt, timeout_ms
        if not step_name:
            super().__init__("The attempt ran past its timeout.")
            return
        super().__init__(f"Step {step_name!r} attempt {attempt} ran past its timeout of {timeout_ms} ms.")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step_name, self.attempt, self.timeout_ms))
