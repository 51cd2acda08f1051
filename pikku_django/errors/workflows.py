"""Errors of workflows and their runs: registration, replay, waits, results, starts."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db.transaction import TransactionManagementError

from pikku_django.errors.base import InvalidArgumentError, PikkuError


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


class ScheduleNotFoundError(InvalidArgumentError, LookupError):
    """No schedule of PIKKU_SCHEDULES goes by this name (or it cannot be triggered)."""

    def __init__(self, name: str, why: str = "no schedule has this name") -> None:
        self.name = name
        super().__init__(
            f"Schedule {name!r}: {why}. `manage.py pikku_schedules` lists the schedules of PIKKU_SCHEDULES."
        )
