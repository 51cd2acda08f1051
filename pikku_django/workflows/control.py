"""Acting on a run from outside it: send it a signal, cancel it."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import write_alias
from pikku_django.models import WorkflowRun, WorkflowSignal


def send_signal(
    run_id: Any,
    name: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
    using: str | None = None,
) -> WorkflowSignal:
    """
    Send the signal ``name`` (a JSON ``payload``) to the run: kept until a
    ``ctx.wait_for_signal(name)`` consumes it, and the run woken if it waits
    for it, in one commit. An unknown or finished run is a ``ValueError``
    naming ``run_id``. A second send with the same ``idempotency_key`` to the
    run stores nothing and returns the first signal.
    """
    signals = WorkflowSignal.objects.db_manager(write_alias(WorkflowSignal, using))
    return signals.send(run_id, name, payload, idempotency_key=idempotency_key)


def cancel_workflow(run_id: Any, *, using: str | None = None) -> bool:
    """
    Cancel the run and its unfinished children; a step running for them is
    fenced out at once. False if the run had already finished.
    """
    runs = WorkflowRun.objects.db_manager(write_alias(WorkflowRun, using))
    try:
        exists = runs.filter(pk=run_id).exists()
    except (ValidationError, ValueError, TypeError):
        exists = False
    if not exists:
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.")
    return runs.get_queryset().filter(pk=run_id).cancel() == 1
