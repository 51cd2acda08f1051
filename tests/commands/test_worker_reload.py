"""
``pikku_worker --reload`` (development only): the worker starts anew when
the project's Python code changes, and drives runs after the restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun
from pikku_django.workflows import start_workflow
from tests.support.children import ROOT, poll_until, read_line, subprocess_env

pytestmark = pytest.mark.slow

#: A module of the project the worker imports (its workflows): touched, not changed.
WATCHED = ROOT / "testproject" / "testing" / "workflows.py"


class ReloadTests(TransactionTestCase):
    def test_a_code_change_restarts_the_worker(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "pikku_worker", "--reload", "--no-schedules", "--interval", "0.1"],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            first = read_line(proc, 60)
            assert first.startswith("pikku_worker ") and first.strip().endswith(" ready"), first
            # The reloader looks at modification times once a second.
            time.sleep(1.5)
            later = time.time() + 5
            os.utime(WATCHED, (later, later))
            second = read_line(proc, 60)
            assert second.strip().endswith(" ready") and second != first, (first, second)
            run = start_workflow("test.steps", {"steps": 1})
            poll_until(lambda: WorkflowRun.objects.get(pk=run.pk).status == "completed" or None, 30)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
