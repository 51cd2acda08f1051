"""Every exception pikku_django raises."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.transaction import TransactionManagementError


class PikkuError(Exception):
    """Base class of every error pikku_django raises."""


class InvalidArgumentError(PikkuError, ValueError):
    """An argument was refused before any SQL ran; the message names it."""


class PikkuConfigurationError(PikkuError, ImproperlyConfigured):
    """A PIKKU_* setting is missing or of the wrong type."""


class LeaseInTransactionError(PikkuError, TransactionManagementError):
    """
    Lease operations commit on their own and cannot run inside
    ``transaction.atomic()``: a lease granted in an open transaction is invisible
    to other processes until commit, and a rollback would hand its token out
    twice. Take the lease before the block, or on another database alias.
    """

    def __init__(self, using: str) -> None:
        super().__init__(
            f"A lease operation on database {using!r} was called inside "
            "transaction.atomic(). Leases commit on their own: take the lease "
            "before entering the atomic block, and do the guarded work inside it."
        )


class LeaseTakenError(PikkuError):
    """The lease is held by someone else."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"Lease {key!r} is held by another holder; try again later.")


class LeaseLostError(PikkuError):
    """The lease lapsed or passed to another holder while its body ran."""

    def __init__(self, key: str, token: int) -> None:
        self.key = key
        self.token = token
        super().__init__(
            f"Lease {key!r} (token {token}) was lost while its body ran: it lapsed "
            "or passed to another holder, so the body's work was not done under it."
        )


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


class WorkflowReplayError(PikkuError):
    """
    A run's stored history no longer fits its workflow's code: another
    function under a stored step name, a map of another length, a patch
    marker the code no longer asks for. ``stored`` is the history's side,
    ``code`` the code's. ``PIKKU_ON_REPLAY_MISMATCH`` says whether the run
    fails (``"fail"``) or is parked, suspended until retried (``"park"``).
    """

    def __init__(self, run_id: object, step_name: str, stored: str, code: str, why: str = "") -> None:
        self.run_id = run_id
        self.step_name = step_name
        self.stored = stored
        self.code = code
        super().__init__(
            f"Run {run_id} cannot replay step {step_name!r}: its history has {stored}, the code has "
            f"{code}{'; ' + why if why else ''}. Keep the old path behind ctx.patched(), give a moved "
            "function a stable @step_function id, or fork the run; then retry it."
        )


class StepFunctionMismatchError(WorkflowReplayError):
    """A step was claimed with a function other than the one it was created with."""

    def __init__(self, run_id: object, step_name: str, expected: str, got: str) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            run_id,
            step_name,
            f"function {expected!r}",
            f"function {got!r}",
            "a step name must keep its function for the life of the run",
        )


class FanOutReplayError(WorkflowReplayError, InvalidArgumentError):
    """
    A ``ctx.map`` or ``ctx.workflows`` replayed with another list than the
    one its step was started with (another length, or other values): a
    ``WorkflowReplayError``, and an ``InvalidArgumentError`` naming the list.
    """

    def __init__(self, run_id: object, step_name: str, argument: str, stored: object, count: int) -> None:
        self.run_id = run_id
        self.step_name = step_name
        self.stored = f"{stored} {argument}"
        self.code = f"{count} {argument} that differ"
        PikkuError.__init__(
            self,
            f"{argument}: step {step_name!r} of run {run_id} was started with {stored} {argument} and "
            f"this replay passes {count} that differ; a replay must pass the same list. Keep the old "
            "list behind ctx.patched(), or fork the run; then retry it.",
        )


class WorkflowNotFoundError(InvalidArgumentError, LookupError):
    """No workflow is registered under this name."""

    def __init__(self, name: str, argument: str = "name") -> None:
        self.name = name
        super().__init__(
            f"{argument}: no workflow is registered as {name!r}. Define it with "
            f"@workflow({name!r}) in a workflows.py module of an installed app."
        )


class WorkflowRegistrationError(PikkuError, ImproperlyConfigured):
    """Two different functions were registered under one workflow name."""


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


class TaskArgumentsError(InvalidArgumentError, TypeError):
    """
    A task's arguments are not JSON: a ``TypeError``, as Django's Tasks
    framework raises for them, and a ``PikkuError``.
    """


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


class WorkerAbortedError(KeyboardInterrupt):
    """
    The worker's own abort (a second SIGTERM/SIGINT): the one
    ``KeyboardInterrupt`` a task's function does not keep as its error. Not a
    ``PikkuError``: it must stay out of reach of ``except Exception``.
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


class SignalTimeoutError(PikkuError):
    """A ``ctx.wait_for_signal`` waited longer than its ``timeout_ms`` on the database clock."""

    def __init__(self, signal: str, timeout_ms: int) -> None:
        self.signal = signal
        self.timeout_ms = timeout_ms
        super().__init__(
            f"No signal {signal!r} arrived within {timeout_ms} ms; catch SignalTimeoutError "
            "in the workflow to go on without it."
        )


class WorkflowCancelledError(PikkuError):
    """The run was cancelled: whatever this code does for it now will be refused."""

    def __init__(self, run_id: object) -> None:
        self.run_id = run_id
        super().__init__(
            f"Workflow run {run_id} was cancelled; its steps' results are refused and no later step starts."
        )


class ResultTimeoutError(PikkuError, TimeoutError):
    """A wait for a run's result reached its deadline on the database clock; the run goes on."""

    def __init__(self, run_id: object, timeout_ms: int) -> None:
        self.run_id = run_id
        self.timeout_ms = timeout_ms
        super().__init__(
            f"Run {run_id} did not finish within {timeout_ms} ms; it goes on unchanged. "
            "Wait again, or read its events and streams meanwhile."
        )


class IdempotencySnapshotError(PikkuError, TransactionManagementError):
    """
    A start lost its idempotency-key race to a run that the caller's
    transaction cannot see: its snapshot is older (REPEATABLE READ or
    SERIALIZABLE on PostgreSQL). Retry the transaction, or start under READ
    COMMITTED (Django's default).
    """

    def __init__(self, idempotency_key: str) -> None:
        self.idempotency_key = idempotency_key
        super().__init__(
            f"idempotency_key {idempotency_key!r}: a concurrent transaction started its run, which this "
            "transaction's snapshot cannot see (isolation REPEATABLE READ or SERIALIZABLE); retry the "
            "transaction, or use READ COMMITTED."
        )


class ItemNotStartedError(PikkuError):
    """An item of a ``ctx.map`` that was never started: another item of it failed first."""

    def __init__(self, run_id: object, step_id: object) -> None:
        self.run_id = run_id
        self.step_id = step_id
        super().__init__(
            f"Not started: another item of the map step {step_id} of run {run_id} "
            "failed or was cancelled first."
        )


class WorkflowTimeoutError(PikkuError):
    """The run was still unfinished at its deadline (``start_workflow(timeout_ms=...)``)."""

    def __init__(self, run_id: object, timeout_ms: int | None = None) -> None:
        self.run_id = run_id
        self.timeout_ms = timeout_ms
        after = f" of {timeout_ms} ms" if timeout_ms is not None else ""
        super().__init__(
            f"Workflow run {run_id} passed its deadline{after} on the database clock unfinished; "
            "it is failed and its children cancelled. Give it a longer timeout_ms if it needs one."
        )


class StoreFailure(BaseException):
    """
    A database or store error raised while a pass ran the workflow function.
    A BaseException, so that the workflow's own ``except Exception`` cannot
    take a database blip for business logic: it unwinds the function, and the
    pass is retried (an outage) or the run fails with ``RunStoreError``.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class RunStoreError(PikkuError):
    """The store failed under a run's pass with an error that is not an outage."""

    def __init__(self, run_id: object, cause: BaseException) -> None:
        super().__init__(
            f"Run {run_id}: the workflow store failed while the pass ran ({type(cause).__name__}: {cause})."
        )
        self.run_id = run_id
        self.cause = cause


class DatabaseNotMigratedError(PikkuError):
    """The app's tables are missing: run ``manage.py migrate``."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(f"The database is not migrated ({cause}); run manage.py migrate.")
        self.cause = cause


class DatabaseMissingError(PikkuError):
    """The database named in ``DATABASES`` does not exist: create it, then run ``manage.py migrate``."""

    def __init__(self, alias: str, name: str) -> None:
        super().__init__(
            f"The database {name!r} (DATABASES[{alias!r}]) does not exist; create it, "
            "then run manage.py migrate."
        )
        self.alias = alias
        self.name = name


class DatabaseUnavailableError(PikkuError):
    """The database stayed out of reach for longer than a loop waits."""

    def __init__(self, seconds: float, cause: BaseException) -> None:
        super().__init__(f"The database has been unreachable for {seconds:.0f} s ({cause}); giving up.")
        self.cause = cause


class ScheduleNotFoundError(InvalidArgumentError, LookupError):
    """No schedule of PIKKU_SCHEDULES goes by this name (or it cannot be triggered)."""

    def __init__(self, name: str, why: str = "no schedule has this name") -> None:
        self.name = name
        super().__init__(
            f"Schedule {name!r}: {why}. `manage.py pikku_schedules` lists the schedules of PIKKU_SCHEDULES."
        )


class WorkerNameTakenError(PikkuError):
    """Another live worker runs under this name."""

    def __init__(self, holder: str) -> None:
        super().__init__(
            f"Another live worker is named {holder!r}: give each worker its own --holder "
            "(or leave it out for a unique default)."
        )
        self.holder = holder


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


class TaskTimeoutError(StepTimeoutError):
    """A Django task's attempt ran past its ``timeout_ms``: a ``StepTimeoutError``."""


class DuplicateRunError(PikkuError):
    """
    A start under a ``dedup_key`` met an unfinished run of the same workflow
    with that key (``dedup="raise"``); ``run_id`` names it.
    """

    def __init__(self, workflow: str, dedup_key: str, run_id: object) -> None:
        self.workflow = workflow
        self.dedup_key = dedup_key
        self.run_id = run_id
        super().__init__(
            f"dedup_key {dedup_key!r}: run {run_id} of workflow {workflow!r} is unfinished; wait for it "
            'to end, or start with dedup="return" to get it instead.'
        )
