"""
The app's tables, one module per concept, every model re-exported here
(``pikku_django.models`` is where Django, the migrations and users find them).
"""

from __future__ import annotations

from pikku_django.models.charts import DELAY_BOUNDS_MS, DELAY_COLUMNS, WorkflowMinute, WorkflowOverview
from pikku_django.models.events import WorkflowEvent, WorkflowStreamItem
from pikku_django.models.fanout import FanOutKind, WorkflowFanOut
from pikku_django.models.fields import ExactCharField, PartialIndex
from pikku_django.models.flow import FlowBucket, FlowKey
from pikku_django.models.leases import Lease, LeaseTokenFloor
from pikku_django.models.patches import WorkflowPatch
from pikku_django.models.queues import WorkflowQueue
from pikku_django.models.runs import (
    DEFAULT_QUEUE,
    MAX_QUEUE_LENGTH,
    TASK_WORKFLOW,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowSignal,
    WorkflowStep,
    WorkflowStepAttempt,
)
from pikku_django.models.schedules import (
    MAX_SCHEDULE_NAME_LENGTH,
    CatchUp,
    Overlap,
    Skipped,
    WorkflowSchedule,
    WorkflowScheduleSetting,
    WorkflowScheduleTick,
)
from pikku_django.models.workers import WorkflowWorker

__all__ = [
    "DELAY_BOUNDS_MS",
    "DELAY_COLUMNS",
    "DEFAULT_QUEUE",
    "MAX_QUEUE_LENGTH",
    "MAX_SCHEDULE_NAME_LENGTH",
    "CatchUp",
    "ExactCharField",
    "PartialIndex",
    "FanOutKind",
    "FlowBucket",
    "FlowKey",
    "Lease",
    "LeaseTokenFloor",
    "Overlap",
    "RunStatus",
    "Skipped",
    "StepStatus",
    "TASK_WORKFLOW",
    "WorkflowEvent",
    "WorkflowFanOut",
    "WorkflowMinute",
    "WorkflowOverview",
    "WorkflowPatch",
    "WorkflowQueue",
    "WorkflowRun",
    "WorkflowSchedule",
    "WorkflowScheduleSetting",
    "WorkflowScheduleTick",
    "WorkflowSignal",
    "WorkflowStep",
    "WorkflowStepAttempt",
    "WorkflowStreamItem",
    "WorkflowWorker",
]
