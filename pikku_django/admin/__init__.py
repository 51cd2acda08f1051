"""Read-only admin for leases, for workflow runs, steps and attempts, and for schedules."""

from __future__ import annotations

from pikku_django.admin.base import (
    ReadOnlyAdmin,
    ReadOnlyMixin,
    ReadOnlyTabularInline,
    db_now_ms,
    format_ms,
    has_change_perm,
    pretty_json,
    short_uuid,
)
from pikku_django.admin.leases import LeaseAdmin, LeaseStateFilter
from pikku_django.admin.queues import WorkflowQueueAdmin
from pikku_django.admin.runs import WorkflowRunAdmin, step_counts
from pikku_django.admin.schedules import WorkflowScheduleAdmin, WorkflowScheduleTickAdmin
from pikku_django.admin.steps import (
    StepColumns,
    WorkflowStepAdmin,
    WorkflowStepAttemptInline,
    WorkflowStepInline,
)
from pikku_django.admin.waits import WorkflowSignalInline, describe_wait, waiting_annotations
from pikku_django.admin.workers import WorkflowWorkerAdmin
from pikku_django.admin.workflows import WorkflowOverviewAdmin

__all__ = [
    "LeaseAdmin",
    "LeaseStateFilter",
    "ReadOnlyAdmin",
    "ReadOnlyMixin",
    "ReadOnlyTabularInline",
    "StepColumns",
    "WorkflowQueueAdmin",
    "WorkflowRunAdmin",
    "WorkflowScheduleAdmin",
    "WorkflowScheduleTickAdmin",
    "WorkflowSignalInline",
    "WorkflowStepAdmin",
    "WorkflowStepAttemptInline",
    "WorkflowOverviewAdmin",
    "WorkflowStepInline",
    "WorkflowWorkerAdmin",
    "db_now_ms",
    "describe_wait",
    "format_ms",
    "has_change_perm",
    "pretty_json",
    "short_uuid",
    "step_counts",
    "waiting_annotations",
]
