"""
SQLite on Django's default settings (DEFERRED transactions, a 5 s timeout):
no "database is locked" reaches a caller or a run, with a worker of four
lanes and another process cancelling, signalling and starting runs beside it.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from pikku_django.models import WorkflowRun
from tests.support.children import poll_until, run_script, subprocess_env
from tests.support.processes import ProcessTestCase

pytestmark = pytest.mark.slow

#: A web process on Django's defaults: starts, signals and cancels runs while a worker drives them.
WEB = """
import json, sys
import django
django.setup()
from django.db import connection
from pikku_django.workflows import cancel_workflow, send_signal, start_workflow
assert "transaction_mode" not in connection.settings_dict["OPTIONS"], connection.settings_dict["OPTIONS"]
errors, started, cancelled = [], [], 0
for i in range(30):
    try:
        signalled = start_workflow("test.signals", {"name": "go", "waits": 1})
        started.append(str(signalled.pk))
        send_signal(signalled.pk, "go", {"i": i})
        doomed = start_workflow("test.slow_steps", {"steps": 3, "ms": 5})
        started.append(str(doomed.pk))
        # False when the worker finished it first: then it stays completed.
        cancelled += cancel_workflow(doomed.pk)
        started.append(str(start_workflow("test.slow_steps", {"steps": 2, "ms": 5}).pk))
    except Exception as error:
        errors.append(repr(error))
print(json.dumps({"errors": errors, "started": started, "cancelled": cancelled}))
"""


class SqliteDefaultsTests(ProcessTestCase):
    def test_lanes_and_web_requests_on_djangos_sqlite_defaults(self) -> None:
        if connection.vendor != "sqlite":
            pytest.skip("Django's SQLite defaults are SQLite's")
        env = subprocess_env(PIKKU_SQLITE_DJANGO_DEFAULTS="1")
        worker = self.worker("defaults", "--concurrency", "8", "--interval", "0.05", env=env)
        web = run_script(WEB, env=env)
        out, err = web.communicate(timeout=120)
        assert web.returncode == 0, err
        report = json.loads(out.splitlines()[-1])
        assert report["errors"] == []
        runs = WorkflowRun.objects.filter(pk__in=report["started"])
        poll_until(lambda: not runs.filter(status__in=["running", "suspended"]).exists(), timeout=120)
        self.stop(worker, "defaults")
        statuses = sorted(runs.values_list("status", flat=True))
        failed = list(runs.filter(status="failed").values_list("workflow", "error"))
        cancelled = report["cancelled"]
        assert statuses == ["cancelled"] * cancelled + ["completed"] * (90 - cancelled), (
            statuses,
            failed[:2],
        )
        assert "database is locked" not in self.log(worker)
