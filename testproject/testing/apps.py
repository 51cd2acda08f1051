from __future__ import annotations

import os
import signal
from typing import Any

from django.apps import AppConfig
from django.db import transaction
from django.db.models.signals import post_save

#: Set in a worker's environment, makes it SIGKILL itself the moment a child
#: run it started is committed (before the pass that started it goes on).
KILL_AFTER_CHILD_START = "PIKKU_TEST_KILL_AFTER_CHILD_START"


def _kill_after_child_start(sender: Any, instance: Any, created: bool, using: str, **kwargs: Any) -> None:
    if created and instance.parent_id is not None:
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL), using=using)


class TestingConfig(AppConfig):
    """Workflows and tables the test suite drives through real worker processes."""

    name = "testproject.testing"
    label = "testing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get(KILL_AFTER_CHILD_START):
            post_save.connect(_kill_after_child_start, sender="pikku_django.WorkflowRun")
