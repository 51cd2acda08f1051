"""
A backend for Django's Tasks framework (``django.tasks`` on Django 6, the
``django_tasks`` backport on 5.2): ``TASKS = {"default": {"BACKEND":
"pikku_django.tasks.PikkuTaskBackend"}}``, and ``manage.py pikku_worker``
runs the tasks. ``backend.wait(result_id, timeout_ms)`` waits for a task's
result; ``set_progress(value)`` inside a task reports its progress.
"""

from __future__ import annotations

from pikku_django.tasks.backend import PikkuTaskBackend
from pikku_django.tasks.options import PikkuTask, options
from pikku_django.tasks.progress import set_progress

__all__ = ["PikkuTask", "PikkuTaskBackend", "options", "set_progress"]
