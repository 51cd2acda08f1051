"""Every exception pikku_django raises, importable from here (``pikku_django.errors``)."""

from __future__ import annotations

from pikku_django.errors.base import InvalidArgumentError, PikkuConfigurationError, PikkuError
from pikku_django.errors.leases import LeaseInTransactionError, LeaseLostError, LeaseTakenError
from pikku_django.errors.steps import (
    NonRetryableError,
    RaisedBaseExceptionError,
    StepFailedError,
    StepLeaseExpiredError,
    StepSupersededError,
    StepTimeoutError,
    WorkerLostError,
)
from pikku_django.errors.tasks import TaskArgumentsError, TaskPathError, TaskTimeoutError
from pikku_django.errors.worker import (
    DatabaseMissingError,
    DatabaseNotMigratedError,
    DatabaseUnavailableError,
    RunStoreError,
    StoreFailure,
    WorkerAbortedError,
    WorkerNameTakenError,
)
from pikku_django.errors.workflows import (
    DuplicateRunError,
    FanOutReplayError,
    IdempotencySnapshotError,
    ItemNotStartedError,
    ResultTimeoutError,
    ScheduleNotFoundError,
    SignalTimeoutError,
    StepFunctionMismatchError,
    WorkflowCancelledError,
    WorkflowNotFoundError,
    WorkflowRegistrationError,
    WorkflowReplayError,
    WorkflowTimeoutError,
)

__all__ = [
    "DatabaseMissingError",
    "DatabaseNotMigratedError",
    "DatabaseUnavailableError",
    "DuplicateRunError",
    "FanOutReplayError",
    "IdempotencySnapshotError",
    "InvalidArgumentError",
    "ItemNotStartedError",
    "LeaseInTransactionError",
    "LeaseLostError",
    "LeaseTakenError",
    "NonRetryableError",
    "PikkuConfigurationError",
    "PikkuError",
    "RaisedBaseExceptionError",
    "ResultTimeoutError",
    "RunStoreError",
    "ScheduleNotFoundError",
    "SignalTimeoutError",
    "StepFailedError",
    "StepFunctionMismatchError",
    "StepLeaseExpiredError",
    "StepSupersededError",
    "StepTimeoutError",
    "StoreFailure",
    "TaskArgumentsError",
    "TaskPathError",
    "TaskTimeoutError",
    "WorkerAbortedError",
    "WorkerLostError",
    "WorkerNameTakenError",
    "WorkflowCancelledError",
    "WorkflowNotFoundError",
    "WorkflowRegistrationError",
    "WorkflowReplayError",
    "WorkflowTimeoutError",
]

# Stored errors name their type by module and name ("pikku_django.errors.WorkerLostError",
# a Task's exception_class_path): each class answers to this module, wherever it is written.
for _name in __all__:
    globals()[_name].__module__ = __name__
