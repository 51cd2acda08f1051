"""Durable workflows: ``@workflow`` functions whose steps survive a worker's death."""

from __future__ import annotations

from pikku_django.workflows.control import cancel_workflow, send_signal
from pikku_django.workflows.current import StepHandle, current_step
from pikku_django.workflows.operate import fork_workflow, retry_workflow
from pikku_django.workflows.registry import get_workflow, workflow
from pikku_django.workflows.replay import step_function
from pikku_django.workflows.results import (
    aget_event,
    aread_stream,
    await_result,
    get_event,
    read_stream,
    wait_for_result,
)
from pikku_django.workflows.runner import run_workflow
from pikku_django.workflows.starts import start_workflow

__all__ = [
    "StepHandle",
    "aget_event",
    "aread_stream",
    "await_result",
    "cancel_workflow",
    "current_step",
    "fork_workflow",
    "get_event",
    "get_workflow",
    "read_stream",
    "retry_workflow",
    "run_workflow",
    "send_signal",
    "start_workflow",
    "step_function",
    "wait_for_result",
    "workflow",
]
