"""bench/tasks.py's settings: the test project's, plus django-tasks-db's DatabaseBackend as "tdb"."""

from __future__ import annotations

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
TASKS = {**TASKS, "tdb": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
