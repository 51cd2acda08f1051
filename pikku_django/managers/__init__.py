"""
Raw-SQL managers. Each decision runs one guarded statement from ``sql`` on
the connection the manager is bound to (so ``db_manager(alias)`` and routers
are respected); everything that decides nothing is plain ORM.
"""

from __future__ import annotations

from pikku_django.managers.base import (
    ACTIVE_RUN_STATUSES,
    FINISHED_RUN_STATUSES,
    SPENT,
    SWEEP_BACKOFF_MAX_MS,
    SWEEP_BACKOFF_MS,
    WOKEN,
    ensure_autocommit,
    serialize_error,
)
from pikku_django.managers.leases import LeaseManager, LeaseQuerySet
from pikku_django.managers.run_queries import WorkflowRunQuerySet
from pikku_django.managers.runs import WorkflowRunManager
from pikku_django.managers.signals import WorkflowSignalManager, WorkflowSignalQuerySet
from pikku_django.managers.steps import WorkflowStepManager, WorkflowStepQuerySet
from pikku_django.sql.cursors import now_params

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "FINISHED_RUN_STATUSES",
    "SPENT",
    "SWEEP_BACKOFF_MAX_MS",
    "SWEEP_BACKOFF_MS",
    "WOKEN",
    "LeaseManager",
    "LeaseQuerySet",
    "WorkflowRunManager",
    "WorkflowRunQuerySet",
    "WorkflowSignalManager",
    "WorkflowSignalQuerySet",
    "WorkflowStepManager",
    "WorkflowStepQuerySet",
    "ensure_autocommit",
    "now_params",
    "serialize_error",
]
