"""Durable workflows: ``@workflow`` functions whose steps survive a worker's death."""

from __future__ import annotations

from pikku_django.workflows.control import cancel_workflow, send_signal
from pikku_django.workflows.current import StepHandle, current_step
from pikku_django.workflows.operate import fork_workflow, retry_workflow
from pikku_django.workflows.registry import get_workflow, workflow
from pikku_django.workflows.runner import run_workflow, start_workflow

__all__ = [
    "StepHandle",
    "cancel_workflow",
    "current_step",
    "fork_workflow",
    "get_workflow",
    "retry_workflow",
    "run_workflow",
    "send_signal",
    "start_workflow",
    "workflow",
]
