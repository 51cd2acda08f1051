"""
``ctx.set_event`` and ``ctx.publish`` from workflow code (exactly once across
replays, under the run lease's fence) and ``current_step().publish`` /
``.set_event`` from a step (fenced to the live attempt); bad names and values
refused before any SQL; events and items pruned with their run.
"""

from __future__ import annotations

import threading

import pytest
from django.test import TransactionTestCase
from django.test.utils import override_settings

from pikku_django.errors import InvalidArgumentError, StepSupersededError
from pikku_django.managers.fence import RunFence
from pikku_django.models import WorkflowEvent, WorkflowRun, WorkflowStep, WorkflowStreamItem
from pikku_django.sweep import prune_runs
from pikku_django.workflows import get_event, read_stream, run_workflow, send_signal, start_workflow
from pikku_django.workflows.context import RunContext
from pikku_django.workflows.current import StepHandle
from pikku_django.workflows.emits import emit_step_name
from pikku_django.workflows.waits import Stop
from tests.support.factories import age, lapse_step, make_run, make_step


def items(run: WorkflowRun, stream: str = "log") -> list[tuple[int, object]]:
    rows = WorkflowStreamItem.objects.filter(run=run, stream=stream).order_by("offset")
    return list(rows.values_list("offset", "item"))


class FromWorkflowCodeTests(TransactionTestCase):
    def test_items_and_events_are_written_once_across_replays(self) -> None:
        run = start_workflow("test.emits", {"before": 3, "after": 2})
        run = run_workflow(run.pk)
        assert run.status == "suspended"
        assert items(run) == [(0, {"i": 0}), (1, {"i": 1}), (2, {"i": 2})]
        assert get_event(run.pk, "status") == {"done": 3}
        # Driven again before the signal: a replay writes nothing more.
        run_workflow(run.pk)
        assert len(items(run)) == 3
        send_signal(run.pk, "go")
        run = run_workflow(run.pk)
        assert run.status == "completed", run.error
        assert run.output == {"offsets": [0, 1, 2, 3, 4]}
        assert items(run) == [(i, {"i": i}) for i in range(5)]
        assert get_event(run.pk, "status") == {"done": 5}
        # One row per key; each call a succeeded step of its own kind.
        assert WorkflowEvent.objects.filter(run=run).count() == 1
        publishes = WorkflowStep.objects.filter(run=run, rpc_name="pikku.publish")
        assert sorted(publishes.values_list("step_name", flat=True)) == [
            f"publish:log#{i}" for i in range(1, 6)
        ]
        assert set(publishes.values_list("status", flat=True)) == {"succeeded"}
        assert WorkflowStep.objects.filter(run=run, rpc_name="pikku.event").count() == 3

    def test_a_pass_that_lost_its_run_lease_writes_nothing(self) -> None:
        run = make_run("test.emits")
        ctx = RunContext(run, using="default", fence=RunFence(run.lease_key, "gone", 7))
        with pytest.raises(Stop):
            ctx.publish("log", 1)
        with pytest.raises(Stop):
            ctx.set_event("status", 1)
        assert not WorkflowStreamItem.objects.filter(run=run).exists()
        assert not WorkflowEvent.objects.filter(run=run).exists()
        assert not WorkflowStep.objects.filter(run=run).exists()

    def test_a_finished_run_takes_no_more(self) -> None:
        run = make_run("test.emits")
        WorkflowRun.objects.filter(pk=run.pk).update(status="cancelled")
        with pytest.raises(Stop):
            RunContext(run, using="default").publish("log", 1)
        assert not WorkflowStreamItem.objects.filter(run=run).exists()

    def test_long_names_get_a_digest_in_their_step_name(self) -> None:
        name = "s" * 255
        assert len(emit_step_name("publish", name, 12)) <= 255
        assert emit_step_name("publish", name, 1) != emit_step_name("publish", name, 2)
        assert emit_step_name("publish", name, 1) == emit_step_name("publish", name, 1)
        run = make_run("test.emits")
        assert RunContext(run, using="default").publish(name, "x") == 0
        assert items(run, name) == [(0, "x")]

    def test_bad_names_and_values_are_refused_before_any_sql(self) -> None:
        run = make_run("test.emits")
        ctx = RunContext(run, using="default")
        for bad in ("", "k" * 256, 7):
            with pytest.raises(InvalidArgumentError, match="stream"):
                ctx.publish(bad, 1)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="key"):
                ctx.set_event(bad, 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="item"):
            ctx.publish("log", object())
        with pytest.raises(InvalidArgumentError, match="value"):
            ctx.set_event("k", "\x00")
        with override_settings(PIKKU_MAX_JSON_BYTES=100), pytest.raises(InvalidArgumentError, match="item"):
            ctx.publish("log", "x" * 200)
        assert not WorkflowStreamItem.objects.exists()
        assert not WorkflowEvent.objects.exists()
        assert not WorkflowStep.objects.filter(run=run).exists()


class FromStepTests(TransactionTestCase):
    def test_a_step_publishes_and_sets_events_as_it_runs(self) -> None:
        run = start_workflow("test.step_emits", {"count": 3}, inline=True)
        assert run.status == "completed", run.error
        assert items(run) == [(0, "line 0"), (1, "line 1"), (2, "line 2"), (3, "done")]
        assert get_event(run.pk, "progress") == {"lines": 3}

    def test_a_superseded_attempt_writes_nothing(self) -> None:
        run = make_run("test.emits")
        step = make_step(run, "report", "x.report")
        assert WorkflowStep.objects.claim(run.pk, "report", "x.report", 60_000) is not None
        old = StepHandle(run.pk, "report", 1, threading.Event(), step_id=step.pk, using="default")
        assert old.publish("log", "a") == 0
        lapse_step(step)
        assert WorkflowStep.objects.claim(run.pk, "report", "x.report", 60_000).attempt == 2  # type: ignore[union-attr]
        with pytest.raises(StepSupersededError):
            old.publish("log", "late")
        with pytest.raises(StepSupersededError):
            old.set_event("progress", "late")
        new = StepHandle(run.pk, "report", 2, threading.Event(), step_id=step.pk, using="default")
        assert new.publish("log", "b") == 1
        new.set_event("progress", "b")
        assert items(run) == [(0, "a"), (1, "b")]
        assert get_event(run.pk, "progress") == "b"

    def test_a_step_of_a_cancelled_run_writes_nothing(self) -> None:
        run = make_run("test.emits")
        step = make_step(run, "report", "x.report")
        WorkflowStep.objects.claim(run.pk, "report", "x.report", 60_000)
        handle = StepHandle(run.pk, "report", 1, threading.Event(), step_id=step.pk, using="default")
        WorkflowRun.objects.filter(pk=run.pk).cancel()
        with pytest.raises(StepSupersededError):
            handle.publish("log", "late")
        assert not WorkflowStreamItem.objects.exists()


class PruneTests(TransactionTestCase):
    @override_settings(PIKKU_RETENTION_MS={"completed": 1_000})
    def test_events_and_items_go_with_their_run(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        assert run.status == "completed"
        age(WorkflowRun, run.pk, 10_000)
        assert prune_runs() == 1
        assert not WorkflowStreamItem.objects.exists()
        assert not WorkflowEvent.objects.exists()
        with pytest.raises(InvalidArgumentError, match="run_id"):
            get_event(run.pk, "status")
        with pytest.raises(InvalidArgumentError, match="run_id"):
            read_stream(run.pk, "log")
