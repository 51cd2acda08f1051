"""
What a run's start checks besides its arguments: that its workflow is not
pikku_django's own (``refuse_internal``), and, when a start under an
idempotency key lost its race, which run won it (``idempotency_winner``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections, models

from pikku_django.errors import IdempotencySnapshotError, InvalidArgumentError

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun


def idempotency_winner(runs: models.QuerySet[WorkflowRun], alias: str, idempotency_key: str) -> WorkflowRun:
    """
    The run that won a start's race for ``idempotency_key``. Inside a
    caller's transaction the read locks, so that under REPEATABLE READ
    (MySQL's and MariaDB's default) it reads the winner's committed row, not
    the transaction's older snapshot; on PostgreSQL a snapshot that cannot
    see it is a clear error (``IdempotencySnapshotError``).
    """
    if connections[alias].in_atomic_block:
        run = runs.select_for_update().filter(idempotency_key=idempotency_key).first()
    else:
        run = runs.filter(idempotency_key=idempotency_key).first()
    if run is None:
        raise IdempotencySnapshotError(idempotency_key)
    return run


def refuse_internal(workflow: object, internal: bool) -> None:
    """A run of an internal workflow is started only by pikku_django's own code."""
    from pikku_django.workflows.registry import is_internal

    if not internal and isinstance(workflow, str) and is_internal(workflow):
        raise InvalidArgumentError(
            f"name: workflow {workflow!r} is pikku_django's own; only its backend starts runs of it "
            "(enqueue a Django Task instead)."
        )
