"""Errors of leases: taken, lost, or asked for inside a transaction."""

from __future__ import annotations

from django.db.transaction import TransactionManagementError

from pikku_django.errors.base import PikkuError


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
