"""
One attempt of a step in a pass: its lease kept renewed by the process's
keeper, its arguments as stored, and its outcome held for the pass's next
write.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync

from pikku_django.keeper import keeper
from pikku_django.leases import KeepAlive
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.models import WorkflowStep


class StepLeaseRenewal(KeepAlive):
    """
    Keeps one attempt's step lease renewed while its function runs, through
    the process's keeper (one renewal thread for every step lease held). It
    answers "lost" once the step is no longer running as this attempt.
    """

    def __init__(self, step: WorkflowStep, lease_ms: int, using: str) -> None:
        super().__init__(f"step {step.step_name!r} (attempt {step.attempt})", lease_ms, using)
        self.step_id = step.pk
        self.attempt = step.attempt

    def renew(self) -> bool:
        return WorkflowStep.objects.db_manager(self.using).refresh_lease(
            self.step_id, self.ttl_ms, attempt=self.attempt
        )

    def batch_key(self) -> Hashable | None:
        return (StepLeaseRenewal, self.using, self.ttl_ms)

    @classmethod
    def renew_together(cls, kept: Sequence[KeepAlive]) -> bool:
        """Every step lease of ``kept`` (one database and lease) in one UPDATE (``refresh_leases``)."""
        renewals = [item for item in kept if isinstance(item, StepLeaseRenewal)]
        steps = WorkflowStep.objects.db_manager(renewals[0].using)
        return steps.refresh_leases([(item.step_id, item.attempt) for item in renewals], renewals[0].ttl_ms)

    def start(self) -> None:
        keeper().keep(self)

    def stop(self) -> None:
        keeper().drop(self)


def wait_for_awaitable(awaitable: Awaitable[Any]) -> Any:
    """The result of an async step's awaitable, on an event loop of its own (or the caller's, via asgiref)."""

    async def wait() -> Any:
        return await awaitable

    return async_to_sync(wait)()


def step_data(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The step's arguments, stored for the admin when they are JSON."""
    data = {"args": list(args), "kwargs": kwargs}
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return data


@dataclass
class PendingOutcome:
    """
    A step's success not yet committed: its outcome as it will be written
    (fenced to its attempt), and the renewal that keeps its step lease
    alive until then, so no claim or sweep takes the step for lost meanwhile.
    """

    step: WorkflowStep
    finish: PreparedFinish
    renewal: StepLeaseRenewal


def spends_budget(step: WorkflowStep) -> bool:
    """Would ``step``, running now, be exhausted once this attempt's failure is recorded?"""
    status = step.status
    step.status = "failed"
    try:
        return step.is_exhausted
    finally:
        step.status = status


__all__ = ["PendingOutcome", "StepLeaseRenewal", "spends_budget", "step_data", "wait_for_awaitable"]
