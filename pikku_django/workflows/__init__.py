"""Durable workflows: ``@workflow`` functions whose steps survive a worker's death."""

from __future__ import annotations

from pikku_django.workflows.registry import get_workflow, workflow
from pikku_django.workflows.runner import run_workflow, start_workflow

__all__ = ["get_workflow", "run_workflow", "start_workflow", "workflow"]
