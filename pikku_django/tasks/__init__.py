"""
A backend for Django's Tasks framework (``django.tasks`` on Django 6, the
``django_tasks`` backport on 5.2): ``TASKS = {"default": {"BACKEND":
"pikku_django.tasks.PikkuTaskBackend"}}``, and ``manage.py pikku_worker``
runs the tasks.
"""

from __future__ import annotations

from pikku_django.tasks.backend import PikkuTaskBackend

__all__ = ["PikkuTaskBackend"]
