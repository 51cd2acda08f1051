"""
Django signals a project can hook: a run's end, a failed attempt, a lost
worker. Each is sent after the commit that recorded it, and costs nothing
(no statement, no object built) while nobody listens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.dispatch import Signal

__all__ = ["attempt_failed", "run_finished", "send_after_commit", "worker_lost"]

#: ``sender=WorkflowRun``, ``run=`` the run, its outcome on it (``status``,
#: ``output``, ``error``): completed or failed by a pass.
run_finished = Signal()

#: ``sender=WorkflowStep``, ``run=``, ``step=``, ``attempt=`` (its number),
#: ``error=`` (what the step raised): an attempt of a step failed.
attempt_failed = Signal()

#: ``sender=WorkflowStep``, ``run=``, ``step=``, ``holder=`` (the lost
#: worker's name, or "" when unknown): a step whose worker was lost was
#: taken over by a new attempt.
worker_lost = Signal()


def send_after_commit(signal: Signal, sender: type, using: str, **kwargs: Any) -> None:
    """
    Send ``signal`` once the transaction open on ``using`` commits (at once
    outside one); nothing at all when it has no receiver for ``sender``.
    """
    if not signal.has_listeners(sender):
        return
    transaction.on_commit(_sender(signal, sender, kwargs), using=using)


def _sender(signal: Signal, sender: type, kwargs: dict[str, Any]) -> Callable[[], None]:
    def send() -> None:
        # A receiver's error is its own: logged by Django, never the run's.
        signal.send_robust(sender, **kwargs)

    return send
