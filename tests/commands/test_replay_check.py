"""
``manage.py pikku_replay_check``: the unfinished runs replayed against the
code of the process (``PIKKU_TEST_DEPLOY``, see ``deploy_workflows``), with
no step function called and no row written; exit 1 naming each run that
would meet a ``WorkflowReplayError``, 0 when all fit.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.test import TransactionTestCase

from pikku_django.models import WorkflowPatch, WorkflowRun
from pikku_django.workflows import run_workflow, start_workflow
from pikku_django.workflows.replay_check import Mismatch
from testproject.testing.deploy_workflows import DEPLOY
from tests.support.children import ROOT, subprocess_env
from tests.support.processes import everything


def deploy(version: str) -> Any:
    return mock.patch.dict(os.environ, {DEPLOY: version})


def check(*args: str) -> tuple[int, str, str]:
    """The command in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("pikku_replay_check", *args, stdout=out, stderr=err)
    except CommandError as error:
        return error.returncode, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


class ReplayCheckTests(TransactionTestCase):
    def setUp(self) -> None:
        # Under v1: runs at a sleep (each one's first step done), one parked at a signal.
        with deploy("v1"):
            self.tax = run_workflow(start_workflow("test.deploy.tax", {"sleep_ms": 60_000}).pk)
            self.waits = run_workflow(start_workflow("test.deploy.tax", {"signal": True}).pk)
            self.moved = run_workflow(start_workflow("test.deploy.moved", {"sleep_ms": 60_000}).pk)
            self.stable = run_workflow(
                start_workflow("test.deploy.moved", {"stable": True, "sleep_ms": 60_000}).pk
            )
            self.marked = run_workflow(start_workflow("test.deploy.unpatched", {"sleep_ms": 60_000}).pk)
            self.done = start_workflow("test.deploy.tax", {"sleep_ms": 1}, inline=True)
        assert self.done.status == "completed" and self.waits.status == "suspended"
        assert WorkflowPatch.objects.filter(run=self.marked).exists()

    def test_all_fit_under_the_code_they_were_started_under(self) -> None:
        with deploy("v1"):
            code, out, _ = check()
        assert code == 0 and "5 runs checked, 0 would not replay." in out

    def test_names_each_run_that_would_not_replay_and_exits_1(self) -> None:
        before = everything()
        with deploy("v2"):
            code, out, _ = check()
        assert code == 1
        assert f"run {self.moved.pk} (test.deploy.moved) step 'charge'" in out
        assert "charge_old_home" in out and "charge_new_home" in out
        assert f"run {self.marked.pk} (test.deploy.unpatched) step 'cool-off'" in out and "'tax-v2'" in out
        for fits in (self.tax, self.waits, self.stable, self.done):
            assert str(fits.pk) not in out
        assert "5 runs checked, 2 would not replay." in out
        # No step function ran (StepCall is among the rows) and no row changed.
        assert everything() == before

    def test_json_is_one_list_of_run_workflow_step_and_reason(self) -> None:
        with deploy("v2"):
            code, out, _ = check("--json")
        assert code == 1
        found = {row["run_id"]: row for row in json.loads(out)}
        assert set(found) == {str(self.moved.pk), str(self.marked.pk)}
        row = found[str(self.moved.pk)]
        assert set(row) == {"run_id", "workflow", "step", "reason"}
        assert (row["workflow"], row["step"]) == ("test.deploy.moved", "charge")
        assert "charge_new_home" in row["reason"]

    def test_status_picks_the_runs_checked(self) -> None:
        with deploy("v2"):
            code, out, _ = check("--status", "suspended")
            assert code == 0 and "1 runs checked, 0 would not replay." in out
            code, out, _ = check("--status", "running,suspended,completed", "--json")
            assert code == 1 and len(json.loads(out)) == 2
        with pytest.raises(CommandError, match="status"):
            call_command("pikku_replay_check", "--status", "sleeping")

    def test_the_mismatch_as_a_dict(self) -> None:
        assert Mismatch("r", "w", "s", "why").as_dict() == {
            "run_id": "r",
            "workflow": "w",
            "step": "s",
            "reason": "why",
        }


class ReplayCheckProcessTests(TransactionTestCase):
    def test_the_command_exits_1_then_0_once_the_run_is_gone(self) -> None:
        with deploy("v1"):
            moved = run_workflow(start_workflow("test.deploy.moved", {"sleep_ms": 60_000}).pk)
        command = [sys.executable, "manage.py", "pikku_replay_check", "--json"]
        env = subprocess_env(**{DEPLOY: "v2"})
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert [row["run_id"] for row in json.loads(done.stdout)] == [str(moved.pk)]
        WorkflowRun.objects.filter(pk=moved.pk).update(status="cancelled")
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr


class ReplayCheckKindsTests(TransactionTestCase):
    def test_a_map_of_another_length_and_a_caught_error_are_reported(self) -> None:
        with deploy("v1"):
            items = run_workflow(start_workflow("test.deploy.items").pk)
            swallows = run_workflow(start_workflow("test.deploy.swallows", {"sleep_ms": 60_000}).pk)
            code, _, _ = check()
        assert code == 0
        with deploy("v2"):
            code, out, _ = check("--json")
        assert code == 1
        found = {row["run_id"]: row for row in json.loads(out)}
        assert set(found) == {str(items.pk), str(swallows.pk)}
        assert found[str(items.pk)]["step"] == "double" and "passes 4" in found[str(items.pk)]["reason"]
        assert found[str(swallows.pk)]["step"] == "charge"
