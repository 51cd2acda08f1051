"""
Safe deploys in one process: runs in flight keep their path under new code
(``ctx.patched``), a moved step function keeps its steps with a stable id
(``@step_function``), and a history that no longer fits fails or parks its
run (``WorkflowReplayError``, ``PIKKU_ON_REPLAY_MISMATCH``) and never loops.
The version of the code is ``PIKKU_TEST_DEPLOY`` (``deploy_workflows``).
"""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from django.test import TransactionTestCase, override_settings

from pikku_django.errors import (
    FanOutReplayError,
    PikkuError,
    StepFunctionMismatchError,
    WorkflowReplayError,
)
from pikku_django.models import Lease, WorkflowPatch, WorkflowRun, WorkflowStep
from pikku_django.sweep import sweep
from pikku_django.workflows import retry_workflow, run_workflow, send_signal, start_workflow, step_function
from testproject.testing.deploy_workflows import DEPLOY, charge_stable_new
from testproject.testing.models import StepCall


def deploy(version: str) -> Any:
    """The code of ``version`` for this process (``deploy_workflows`` reads it at each call)."""
    return mock.patch.dict(os.environ, {DEPLOY: version})


def wake_sleep(run: WorkflowRun, name: str = "cool-off") -> None:
    """The run's sleep ``name`` is over now (as if its time had come)."""
    step = WorkflowStep.objects.get(run=run, step_name=name)
    now = Lease.objects.db_now_ms()
    WorkflowStep.objects.filter(pk=step.pk).update(data={**step.data, "wake_at": now - 1})
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=now - 1)


def called(run: WorkflowRun) -> list[str]:
    return list(StepCall.objects.filter(run_id=run.pk).order_by("id").values_list("step", flat=True))


def markers(run: WorkflowRun) -> list[str]:
    return list(WorkflowPatch.objects.filter(run=run).values_list("name", flat=True))


class PatchedTests(TransactionTestCase):
    def test_a_run_started_under_v1_keeps_the_old_branch_and_a_new_run_takes_the_new(self) -> None:
        with deploy("v1"):
            old = run_workflow(start_workflow("test.deploy.tax", {"sleep_ms": 60_000}).pk)
        assert old.status == "running" and called(old) == ["tax_v1"]
        with deploy("v2"):
            wake_sleep(old)
            old = run_workflow(old.pk)
            new = start_workflow("test.deploy.tax", {"sleep_ms": 1}, inline=True)
        assert old.status == "completed" and old.output["tax"] == "tax v1"
        assert called(old) == ["tax_v1", "receipt"] and markers(old) == []
        assert new.status == "completed" and new.output["tax"] == "tax v2"
        assert called(new) == ["tax_v2", "receipt"] and markers(new) == ["tax-v2"]
        assert WorkflowRun.objects.get(pk=new.pk).has_patches

    def test_a_run_waiting_for_a_signal_keeps_the_old_branch(self) -> None:
        with deploy("v1"):
            old = run_workflow(start_workflow("test.deploy.tax", {"signal": True}).pk)
        assert old.status == "suspended"
        with deploy("v2"):
            send_signal(old.pk, "go")
            old = run_workflow(old.pk)
        assert old.status == "completed" and old.output["tax"] == "tax v1" and markers(old) == []

    def test_a_marker_once_written_keeps_the_new_branch_on_every_replay(self) -> None:
        with deploy("v2"):
            run = run_workflow(start_workflow("test.deploy.tax", {"sleep_ms": 60_000}).pk)
            assert markers(run) == ["tax-v2"]
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "completed" and run.output["tax"] == "tax v2"
        assert called(run) == ["tax_v2", "receipt"] and markers(run) == ["tax-v2"]

    def test_a_marker_the_code_no_longer_asks_for_is_a_replay_error(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.unpatched", {"sleep_ms": 60_000}).pk)
        assert markers(run) == ["tax-v2"]
        with deploy("v2"):
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "failed" and run.error["type"].endswith("WorkflowReplayError")
        assert "'tax-v2'" in run.error["message"] and "'receipt'" in run.error["message"]
        assert str(run.pk) in run.error["message"]
        # The new step was never run.
        assert called(run) == ["tax_v2"]

    def test_deprecate_patch_keeps_a_marked_run_fitting_and_writes_nothing(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.unpatched", {"sleep_ms": 60_000}).pk)
        with deploy("v2-deprecated"):
            wake_sleep(run)
            run = run_workflow(run.pk)
            fresh = start_workflow("test.deploy.unpatched", {"sleep_ms": 1}, inline=True)
        assert run.status == "completed" and markers(run) == ["tax-v2"]
        assert fresh.status == "completed" and markers(fresh) == []


class StepFunctionTests(TransactionTestCase):
    def test_a_stable_id_is_the_rpc_name_and_survives_a_move(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.moved", {"stable": True, "sleep_ms": 60_000}).pk)
        assert WorkflowStep.objects.get(run=run, step_name="charge").rpc_name == "billing.charge"
        with deploy("v2"):
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "completed" and called(run) == ["charge", "receipt"]

    def test_a_moved_function_without_an_id_fails_the_run_naming_both_paths(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.moved", {"sleep_ms": 60_000}).pk)
        with deploy("v2"):
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "failed" and run.wake_at is None
        message = run.error["message"]
        assert "deploy_workflows.charge_old_home" in message and "deploy_workflows.charge_new_home" in message
        assert str(run.pk) in message and "'charge'" in message
        assert called(run) == ["charge"]

    def test_a_workflow_that_catches_the_replay_error_still_fails_on_it(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.swallows", {"sleep_ms": 60_000}).pk)
        with deploy("v2"):
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "failed" and run.error["type"].endswith("StepFunctionMismatchError")

    def test_step_function_refuses_a_bad_id(self) -> None:
        for bad in ("", "x" * 256, 7):
            with pytest.raises(ValueError, match="id") as info:
                step_function(bad)  # type: ignore[arg-type]
            assert isinstance(info.value, PikkuError)

        def fn() -> None: ...

        assert step_function("x" * 255)(fn) is fn
        assert charge_stable_new.pikku_step_id == "billing.charge"  # type: ignore[attr-defined]

    def test_the_errors(self) -> None:
        assert issubclass(StepFunctionMismatchError, WorkflowReplayError)
        assert issubclass(WorkflowReplayError, PikkuError)
        assert issubclass(FanOutReplayError, WorkflowReplayError) and issubclass(
            FanOutReplayError, ValueError
        )
        error = WorkflowReplayError("r1", "tax", "function 'a.b'", "function 'c.d'")
        assert (error.run_id, error.step_name, error.stored, error.code) == (
            "r1",
            "tax",
            "function 'a.b'",
            "function 'c.d'",
        )
        assert "r1" in str(error) and "'tax'" in str(error) and "a.b" in str(error) and "c.d" in str(error)


class MapReplayTests(TransactionTestCase):
    def test_a_map_of_another_length_is_a_replay_error(self) -> None:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.items").pk)
        assert run.status == "running"
        with deploy("v2"):
            run = run_workflow(run.pk)
        assert run.status == "failed" and run.error["type"].endswith("FanOutReplayError")
        assert "started with 3 items" in run.error["message"] and "passes 4" in run.error["message"]


@override_settings(PIKKU_ON_REPLAY_MISMATCH="park")
class ParkTests(TransactionTestCase):
    def parked(self) -> WorkflowRun:
        with deploy("v1"):
            run = run_workflow(start_workflow("test.deploy.moved", {"sleep_ms": 60_000}).pk)
        with deploy("v2"):
            wake_sleep(run)
            run = run_workflow(run.pk)
        assert run.status == "suspended" and run.wake_at is None
        assert run.error["type"].endswith("StepFunctionMismatchError")
        return run

    def test_a_parked_run_is_never_woken_and_completes_once_fixed_and_retried(self) -> None:
        run = self.parked()
        sweep(stalled_after_ms=0)
        run.refresh_from_db()
        assert run.status == "suspended" and run.wake_at is None
        # The code is fixed (v1's function again): the retry revives it, due now.
        with deploy("v1"):
            assert retry_workflow(run.pk) is True
            assert retry_workflow(run.pk) is False
            run = WorkflowRun.objects.get(pk=run.pk)
            assert run.status == "running" and run.error is None and run.wake_at is not None
            run = run_workflow(run.pk)
        assert run.status == "completed" and called(run) == ["charge", "receipt"]

    def test_a_parked_run_retried_under_code_that_still_does_not_fit_parks_again(self) -> None:
        run = self.parked()
        with deploy("v2"):
            assert retry_workflow(run.pk) is True
            run = run_workflow(run.pk)
        assert run.status == "suspended" and run.wake_at is None and called(run) == ["charge"]
