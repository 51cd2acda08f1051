"""
Patch markers: written once, under the run lease's fence (two passes racing
on two connections write one), only at the run's frontier, pruned with the
run, and copied by a fork with the steps taken after them.
"""

from __future__ import annotations

import threading
from typing import Any

from django.test import TransactionTestCase

from pikku_django.models import WorkflowPatch, WorkflowRun, WorkflowStep
from pikku_django.workflows import fork_workflow, run_workflow, start_workflow, workflow
from tests.support.factories import lapse
from tests.support.threads import in_thread

#: Per thread name, the events of its stop before ``ctx.patched``: (reached, release).
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}

#: What each pass's ``ctx.patched("race")`` answered, by thread name.
ANSWERS: dict[str, bool] = {}


def noop(value: str) -> str:
    return value


@workflow("markers.gate_then_patch")
def gate_then_patch(ctx: Any, input: Any) -> Any:
    name = threading.current_thread().name
    gate = GATES.get(name)
    if gate is not None:
        gate[0].set()
        assert gate[1].wait(30), "never released"
    ANSWERS[name] = ctx.patched("race")
    ctx.sleep("nap", 60_000)
    return "woke"


@workflow("markers.step_then_patch")
def step_then_patch(ctx: Any, input: Any) -> Any:
    first = ctx.step("first", noop, "first")
    path = "new" if ctx.patched("later") else "old"
    ctx.sleep("nap", (input or {}).get("sleep_ms", 60_000))
    return {"first": first, "path": ctx.step(path, noop, path)}


class MarkerRaceTests(TransactionTestCase):
    def tearDown(self) -> None:
        for _, release in GATES.values():
            release.set()
        GATES.clear()
        ANSWERS.clear()

    def test_two_passes_racing_at_the_frontier_write_one_marker(self) -> None:
        run = start_workflow("markers.gate_then_patch")
        GATES["A"] = (threading.Event(), threading.Event())
        a = in_thread("A", lambda: run_workflow(run.pk, holder="A"))
        assert GATES["A"][0].wait(30)
        # A stands before ctx.patched, past its run lease: B takes the run and writes the marker.
        lapse(run.lease_key)
        b = in_thread("B", lambda: run_workflow(run.pk, holder="B"))
        b.join(30)
        assert ANSWERS["B"] is True
        GATES["A"][1].set()
        a.join(30)
        # A met the marker it had not read, under a lease it no longer holds: it wrote nothing.
        assert "A" not in ANSWERS
        assert list(WorkflowPatch.objects.filter(run=run).values_list("name", flat=True)) == ["race"]
        assert list(WorkflowStep.objects.filter(run=run).values_list("step_name", "attempt")) == [("nap", 1)]
        run.refresh_from_db()
        assert run.has_patches and run.status == "running"

    def test_a_stale_pass_first_at_the_call_writes_nothing_and_the_next_writes_it(self) -> None:
        run = start_workflow("markers.gate_then_patch")
        GATES["A"] = (threading.Event(), threading.Event())
        a = in_thread("A", lambda: run_workflow(run.pk, holder="A"))
        assert GATES["A"][0].wait(30)
        lapse(run.lease_key)
        GATES["A"][1].set()
        a.join(30)
        assert "A" not in ANSWERS and not WorkflowPatch.objects.filter(run=run).exists()
        assert not WorkflowRun.objects.get(pk=run.pk).has_patches
        in_thread("B", lambda: run_workflow(run.pk, holder="B")).join(30)
        assert ANSWERS["B"] is True and WorkflowPatch.objects.filter(run=run).count() == 1


class MarkerTests(TransactionTestCase):
    def test_a_run_past_the_call_gets_no_marker_and_keeps_the_old_path(self) -> None:
        run = start_workflow("markers.step_then_patch", {"sleep_ms": 60_000})
        # As if an older code had run "first" and then slept, with no patch call between.
        WorkflowStep.objects.create(
            run=run,
            step_name="first",
            rpc_name=f"{noop.__module__}.{noop.__qualname__}",
            status="succeeded",
            result="first",
            retries=0,
            created_at=run.created_at,
            updated_at=run.created_at,
        )
        WorkflowStep.objects.create(
            run=run,
            step_name="nap",
            rpc_name="pikku.sleep",
            status="succeeded",
            data={"ms": 1, "wake_at": 0},
            retries=0,
            created_at=run.created_at,
            updated_at=run.created_at,
        )
        run = run_workflow(run.pk)
        # "first" was replayed, but the stored "nap" was not yet when patched() was called.
        assert run.status == "completed" and run.output == {"first": "first", "path": "old"}
        assert not WorkflowPatch.objects.filter(run=run).exists()

    def test_a_marker_is_written_once_across_passes_and_pruned_with_its_run(self) -> None:
        run = run_workflow(start_workflow("markers.step_then_patch").pk)
        assert list(WorkflowPatch.objects.filter(run=run).values_list("name", flat=True)) == ["later"]
        WorkflowStep.objects.filter(run=run, step_name="nap").update(data={"ms": 1, "wake_at": 0})
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=0)
        run = run_workflow(run.pk)
        assert run.output == {"first": "first", "path": "new"}
        assert WorkflowPatch.objects.filter(run=run).count() == 1
        WorkflowRun.objects.filter(pk=run.pk).delete()
        assert not WorkflowPatch.objects.exists()

    def test_a_fork_holds_the_markers_written_before_its_step(self) -> None:
        run = run_workflow(start_workflow("markers.step_then_patch").pk)
        after = fork_workflow(run.pk, from_step="nap")
        assert list(WorkflowPatch.objects.filter(run=after).values_list("name", flat=True)) == ["later"]
        assert WorkflowRun.objects.get(pk=after.pk).has_patches
        before = fork_workflow(run.pk, from_step="first")
        assert not WorkflowPatch.objects.filter(run=before).exists()
