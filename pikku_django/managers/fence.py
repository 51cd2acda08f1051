"""
The run fence: what makes a pass's run-level writes its own.

A pass holds the run lease ``workflow-run:<id>``; every write it makes to the
run row, and every first insert of a sleep, wait or child step, carries the
condition that this lease is still this holder's and token's and live on the
database clock, in the same statement. A pass that lost its lease (a pause
longer than the lease, a partition, an expired lease) matches nothing and
changes nothing, as a step write of a superseded attempt changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Exists

from pikku_django import models as pikku_models
from pikku_django.clock import DbNowMs


@dataclass(frozen=True)
class RunFence:
    """The run lease a pass holds: key, holder and token."""

    key: str
    holder: str
    token: int

    def held(self, alias: str) -> Exists:
        """A condition true while the lease is still this one and live (for ``.filter()``)."""

        return Exists(
            pikku_models.Lease.objects.using(alias).filter(
                key=self.key, holder=self.holder, token=self.token, expires_at__gt=DbNowMs()
            )
        )

    def params(self) -> dict[str, Any]:
        """The lease guard's parameters in a raw statement (``sql.attempts._RUN_ACTIVE``)."""
        return {"lease_key": self.key, "lease_holder": self.holder, "lease_token": self.token}


#: The guard's parameters for a write made outside a pass (no lease to check).
UNFENCED: dict[str, Any] = {"lease_key": None, "lease_holder": None, "lease_token": None}
