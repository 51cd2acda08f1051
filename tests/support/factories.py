"""Typed factories for rows the tests start from, and moves of their times on the database clock."""

from __future__ import annotations

import datetime
from typing import Any

from django.db import models
from django.db.models import F

from pikku_django.models import Lease, WorkflowRun, WorkflowStep


def lapse(key: str, ago_ms: int = 1) -> None:
    """Move a lease's expiry into the past on the database clock (no sleeping)."""
    now = Lease.objects.db_now_ms()
    Lease.objects.filter(key=key).update(expires_at=now - ago_ms)


def make_run(workflow: str = "order", **kwargs: Any) -> WorkflowRun:
    """A fresh running run."""
    return WorkflowRun.objects.create_run(workflow, **kwargs)


def make_step(
    run: WorkflowRun | None = None, step_name: str = "charge", rpc_name: str = "shop.charge", **kwargs: Any
) -> WorkflowStep:
    """A fresh pending step (on a fresh run unless one is given)."""
    return WorkflowStep.objects.insert_step(run or make_run(), step_name, rpc_name, **kwargs)


def lapse_step(step: WorkflowStep, ago_ms: int = 1) -> None:
    """Move a step's lease into the past on the database clock (no sleeping)."""
    now = Lease.objects.db_now_ms()
    WorkflowStep.objects.filter(pk=step.pk).update(lease_expires_at=now - ago_ms)


def age(model: type[models.Model], pk: Any, ms: int) -> None:
    """Move a row's updated_at ``ms`` into the past."""
    model._default_manager.filter(pk=pk).update(
        updated_at=F("updated_at") - datetime.timedelta(milliseconds=ms)
    )
