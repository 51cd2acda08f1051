"""
The status a user is shown for a run. A fan-out's item not released yet is
stored ``suspended`` with no ``wake_at`` (what the release reads,
``store.fanout``), but it has not started and waits for no signal: it is
shown as ``pending`` (held by its fan-out), in the admin, the cockpit and
the metrics alike, and ``suspended`` is left to the runs that wait.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q

from pikku_django import models as pikku_models

#: The status an item not released yet is stored with (no worker takes it: no ``wake_at``).
HELD = "suspended"

#: The status shown for a fan-out's item not released yet.
PENDING = "pending"

#: ``PENDING`` in words, where a status is shown to a reader.
PENDING_LABEL = "pending (held by its fan-out)"

#: The statuses a user is shown, in the order the cockpit counts them.
SHOWN_STATUSES = ("running", PENDING, "suspended", "completed", "failed", "cancelled")


def held_items() -> Q:
    """
    The fan-out items not released yet: suspended, no ``wake_at``, not
    parked (no error), and no step of theirs suspended on a wait (a child
    of ``ctx.workflows`` waiting for a signal is suspended too, and shown so).
    """
    waiting = pikku_models.WorkflowStep.objects.filter(run=OuterRef("pk"), status="suspended")
    held = Q(status=HELD, wake_at__isnull=True, error__isnull=True, parent_step__isnull=False)
    return cast(Q, held & ~Exists(waiting))


def shown_as(status: str) -> Q:
    """The runs shown with ``status`` (one of ``SHOWN_STATUSES``)."""
    if status == PENDING:
        return held_items()
    if status == HELD:
        return Q(status=HELD) & ~held_items()
    return Q(status=status)


def is_held_annotation() -> ExpressionWrapper[Q]:
    """``held_items()`` as a boolean column of each run (``is_held``)."""
    return ExpressionWrapper(held_items(), output_field=BooleanField())


def shown_status(run: Any) -> str:
    """
    The status ``run`` is shown with: ``pending`` for an item not released
    yet, else its own. Reads the ``is_held`` annotation when the run has it.
    """
    if run.status != HELD or run.parent_step_id is None or run.wake_at is not None:
        return str(run.status)
    held = getattr(run, "is_held", None)
    if held is None:
        runs = pikku_models.WorkflowRun.objects.using(run._state.db)
        held = runs.filter(held_items(), pk=run.pk).exists()
    return PENDING if held else str(run.status)
