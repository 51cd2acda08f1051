"""Errors of the worker process and its database: aborted, not migrated, missing, down, its name taken."""

from __future__ import annotations

from pikku_django.errors.base import PikkuError


class WorkerAbortedError(KeyboardInterrupt):
    """
    The worker's own abort (a second SIGTERM/SIGINT): the one
    ``KeyboardInterrupt`` a task's function does not keep as its error. Not a
    ``PikkuError``: it must stay out of reach of ``except Exception``.
    """


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


class WorkerNameTakenError(PikkuError):
    """Another live worker runs under this name."""

    def __init__(self, holder: str) -> None:
        super().__init__(
            f"Another live worker is named {holder!r}: give each worker its own --holder "
            "(or leave it out for a unique default)."
        )
        self.holder = holder
