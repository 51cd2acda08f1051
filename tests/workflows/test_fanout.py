"""
ctx.map and ctx.workflows in one process: items as runs of their own,
released in order up to max_parallel, results in order, the parent woken
once by the last end, a spent item halting the rest, replays, bad input
refused before any row, the cost of an item's end, and the admin's line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.errors import InvalidArgumentError, WorkflowNotFoundError
from pikku_django.models import WorkflowFanOut, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import cancel_workflow, retry_workflow, run_workflow, start_workflow
from pikku_django.workflows.context import RunContext
from pikku_django.workflows.fanout_items import MAP_ITEM_WORKFLOW
from pikku_django.workflows.waits import Suspend
from testproject.testing.fanout_workflows import record_item
from testproject.testing.models import StepCall


def items_of(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent=run, parent_step__isnull=False).order_by("parent_index"))


def due_items(run: WorkflowRun) -> list[WorkflowRun]:
    return [item for item in items_of(run) if item.status == "running" and item.wake_at is not None]


def drive_items(run: WorkflowRun) -> None:
    """Drive every due item of ``run`` (and those they release) to its end, as a worker would."""
    while True:
        due = due_items(run)
        if not due:
            return
        for item in due:
            run_workflow(item.pk)


def fresh(run: WorkflowRun) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run.pk)


def starts(index: int) -> int:
    return StepCall.objects.filter(step=f"start:{index}").count()


class MapTests(TransactionTestCase):
    def test_each_item_is_a_run_of_its_own_and_the_results_come_in_order(self) -> None:
        run = start_workflow("test.map", {"items": [{"i": i} for i in range(5)]}, queue="bulk", priority=3)
        run = run_workflow(run.pk)
        # The parent is parked on the step, holding no worker: nothing wakes it but the last item.
        step = WorkflowStep.objects.get(run=run, step_name="items")
        assert (step.status, step.lease_expires_at, step.rpc_name) == ("running", None, "pikku.map")
        assert (run.status, run.wake_at) == ("running", None)
        items = items_of(run)
        assert [item.parent_index for item in items] == [0, 1, 2, 3, 4]
        assert {(item.workflow, item.queue, item.priority, item.status) for item in items} == {
            (MAP_ITEM_WORKFLOW, "bulk", 3, "running")
        }
        # Driven in reverse order, the results still come in the order of the items.
        for item in reversed(items):
            assert fresh(run).wake_at is None
            run_workflow(item.pk)
        assert fresh(run).wake_at == 0
        run = run_workflow(run.pk)
        assert run.status == "completed"
        assert run.output == {"results": [0, 10, 20, 30, 40], "sum": 100}
        # Each item a step of its own, with its own attempt, called once.
        for item in items:
            assert WorkflowStep.objects.filter(run=item).values_list("step_name", "status").get() == (
                "items",
                "succeeded",
            )
        assert [starts(i) for i in range(5)] == [1] * 5

    def test_max_parallel_releases_the_next_item_as_one_ends(self) -> None:
        run = start_workflow(
            "test.map", {"items": [{"i": i} for i in range(5)], "options": {"max_parallel": 2}}
        )
        run_workflow(run.pk)
        assert [item.parent_index for item in due_items(run)] == [0, 1]
        held = [item for item in items_of(run) if item.parent_index >= 2]
        assert {(item.status, item.wake_at) for item in held} == {("suspended", None)}
        # A held item is neither due nor stalled: no worker and no sweep takes it.
        assert not WorkflowRun.objects.due().filter(pk__in=[item.pk for item in held]).exists()
        assert not set(WorkflowRun.objects.stalled(0)) & {item.pk for item in held}
        run_workflow(due_items(run)[1].pk)
        assert [item.parent_index for item in due_items(run)] == [0, 2]
        drive_items(run)
        assert run_workflow(run.pk).output["results"] == [0, 10, 20, 30, 40]
        fan_out = WorkflowFanOut.objects.get(step__run=run)
        assert (fan_out.total, fan_out.released, fan_out.ended, fan_out.halted) == (5, 5, 5, False)

    def test_a_replay_returns_the_stored_list_without_calling_anything(self) -> None:
        run = start_workflow("test.map", {"items": [{"i": i} for i in range(3)]}, inline=True)
        assert run.output["results"] == [0, 10, 20]
        calls = StepCall.objects.count()
        ctx = RunContext(fresh(run), using="default")
        assert ctx.map("items", record_item, [{"i": i} for i in range(3)]) == [0, 10, 20]
        assert StepCall.objects.count() == calls

    def test_other_items_on_replay_are_a_clear_error(self) -> None:
        run = WorkflowRun.objects.create_run("test.map")
        with self.assertRaises(Suspend):
            RunContext(run, using="default").map("items", record_item, [{"i": 1}, {"i": 2}])
        for other in ([{"i": 1}], [{"i": 1}, {"i": 3}]):
            with self.assertRaisesRegex(
                InvalidArgumentError, "^items: step 'items' .* was started with 2 items"
            ):
                RunContext(run, using="default").map("items", record_item, other)
        assert WorkflowRun.objects.filter(parent=run).count() == 2

    def test_a_spent_item_stops_the_items_not_started_and_fails_the_step(self) -> None:
        items = [{"i": i, "fail": i == 1} for i in range(5)]
        run = start_workflow("test.map", {"items": items, "options": {"max_parallel": 2, "retries": 1}})
        run_workflow(run.pk)
        _, second = due_items(run)
        run_workflow(second.pk)  # attempts 1 and 2 fail: spent
        assert fresh(second).status == "failed"
        assert WorkflowStepAttempt.objects.filter(step__run=second).count() == 2
        # Items not started (held, or due and not begun) never start; with
        # nothing in flight, the parent is woken at once. (An item in flight
        # runs to its end first: tests/workflows/test_fanout_processes.py.)
        assert {item.parent_index: item.status for item in items_of(run)} == {
            0: "cancelled",
            1: "failed",
            2: "cancelled",
            3: "cancelled",
            4: "cancelled",
        }
        assert "Not started" in fresh(items_of(run)[3]).error["message"]
        assert fresh(run).wake_at == 0
        run = run_workflow(run.pk)
        assert run.output == {"failed": "item 1 fails", "item": 1}
        assert [starts(i) for i in range(5)] == [0, 2, 0, 0, 0]

    def test_an_empty_list_is_an_empty_result(self) -> None:
        run = start_workflow("test.map", {"items": []}, inline=True)
        assert run.output == {"results": [], "sum": 0}
        assert not WorkflowRun.objects.filter(parent=run).exists()

    def test_bad_input_is_refused_before_any_row_is_written(self) -> None:
        ctx = RunContext(WorkflowRun.objects.create_run("test.map"), using="default")

        def nested(item: Any) -> Any:
            return item

        cases: list[tuple[str, dict[str, Any]]] = [
            ("^items must be a list", {"items": {"a": 1}}),
            ("^items must be a list", {"items": (i for i in range(2))}),
            ("^items\\[1\\] ", {"items": [1, object()]}),
            ("^max_parallel ", {"items": [1], "max_parallel": 0}),
            ("^max_parallel ", {"items": [1], "max_parallel": True}),
            ("^max_parallel ", {"items": [1], "max_parallel": "2"}),
            ("^retries ", {"items": [1], "retries": -1}),
            ("^lease_ms ", {"items": [1], "lease_ms": 0}),
            ("^fn: .* cannot be imported", {"items": [1], "fn": lambda item: item}),
            ("^fn: .* cannot be imported", {"items": [1], "fn": nested}),
            ("^fn must be callable", {"items": [1], "fn": 3}),
        ]
        with CaptureQueriesContext(connection) as queries:
            for pattern, arguments in cases:
                fn = arguments.pop("fn", record_item)
                with self.assertRaisesRegex(InvalidArgumentError, pattern):
                    ctx.map("items", fn, **arguments)
            with self.assertRaisesRegex(WorkflowNotFoundError, "^workflow_name: no workflow"):
                ctx.workflows("children", "no.such.workflow", [1])
            with self.assertRaisesRegex(InvalidArgumentError, "^inputs must be a list"):
                ctx.workflows("children", "test.fan_child", "abc")
            with self.assertRaisesRegex(InvalidArgumentError, "^max_parallel "):
                ctx.workflows("children", "test.fan_child", [{"i": 1}], max_parallel=-1)
            with self.assertRaisesRegex(InvalidArgumentError, "^workflow_name: .* pikku_django's own"):
                ctx.workflows("children", MAP_ITEM_WORKFLOW, [{"i": 1}])
        assert len(queries) == 0
        assert WorkflowStep.objects.count() == 0

    def test_the_end_of_an_item_costs_the_same_however_many_siblings_it_has(self) -> None:
        costs = []
        for count in (4, 40):
            run = start_workflow("test.map", {"items": [{"i": i} for i in range(count)]})
            run_workflow(run.pk)
            item = items_of(run)[1]
            with CaptureQueriesContext(connection) as queries:
                run_workflow(item.pk)
            costs.append(len(queries))
        assert costs[0] == costs[1], costs

    def test_cancelling_the_parent_cancels_every_item(self) -> None:
        run = start_workflow(
            "test.map", {"items": [{"i": i} for i in range(4)], "options": {"max_parallel": 2}}
        )
        run_workflow(run.pk)
        assert cancel_workflow(run.pk)
        assert {item.status for item in items_of(run)} == {"cancelled"}
        assert WorkflowStep.objects.get(run=run, step_name="items").status == "failed"


class MapRetryTests(TransactionTestCase):
    def test_a_retry_runs_only_the_items_that_did_not_complete(self) -> None:
        gate = Path(tempfile.mkdtemp()) / "gate"
        items = [{"i": i, "fail_unless": str(gate) if i == 2 else None} for i in range(6)]
        options = {"max_parallel": 2, "retries": 0}
        run = start_workflow("test.map_strict", {"items": items, "options": options})
        run_workflow(run.pk)
        drive_items(run)
        run = run_workflow(run.pk)
        assert run.status == "failed" and run.error["item"] == 2
        statuses = [item.status for item in items_of(run)]
        assert statuses == ["completed", "completed", "failed"] + ["cancelled"] * 3
        gate.touch()
        assert retry_workflow(run.pk)
        run_workflow(run.pk)
        # Two of the four revived items are due, the rest held; the completed two are not run again.
        assert [item.parent_index for item in due_items(run)] == [2, 3]
        drive_items(run)
        run = run_workflow(run.pk)
        assert (run.status, run.output) == ("completed", [0, 10, 20, 30, 40, 50])
        assert [starts(i) for i in range(6)] == [1, 1, 2, 1, 1, 1]
        step = WorkflowStep.objects.get(run=run, step_name="items")
        assert (step.status, step.attempt) == ("succeeded", 2)


class ChildrenTests(TransactionTestCase):
    def test_one_child_per_input_outputs_in_order_at_most_max_parallel_unfinished(self) -> None:
        inputs = [{"i": i} for i in range(5)]
        run = start_workflow("test.fan_parent", {"inputs": inputs, "max_parallel": 2}, priority=2)
        run_workflow(run.pk)
        children = items_of(run)
        assert [(child.workflow, child.priority) for child in children] == [("test.fan_child", 2)] * 5
        while due_items(run):
            assert len(due_items(run)) <= 2
            run_workflow(due_items(run)[-1].pk)
        run = run_workflow(run.pk)
        assert run.output == {"outputs": [{"shipped": i} for i in range(5)]}
        assert WorkflowRun.objects.filter(parent=run).count() == 5

    def test_a_failed_child_cancels_its_unfinished_siblings_and_fails_the_step(self) -> None:
        inputs = [{"i": i, "fail": i == 2} for i in range(5)]
        run = start_workflow("test.fan_parent", {"inputs": inputs, "max_parallel": 3})
        run_workflow(run.pk)
        run_workflow(due_items(run)[2].pk)
        assert [child.status for child in items_of(run)] == [
            "cancelled",
            "cancelled",
            "failed",
            "cancelled",
            "cancelled",
        ]
        run = fresh(run)
        assert run.wake_at == 0
        run = run_workflow(run.pk)
        assert run.output == {"failed": "child 2 fails"}
        step = WorkflowStep.objects.get(run=run, step_name="ship")
        assert (step.status, step.error["item"]) == ("failed", 2)

    def test_a_cancelled_parent_cancels_every_child(self) -> None:
        run = start_workflow("test.fan_parent", {"inputs": [{"i": i} for i in range(3)]})
        run_workflow(run.pk)
        run_workflow(items_of(run)[0].pk)
        assert cancel_workflow(run.pk)
        assert [child.status for child in items_of(run)] == ["completed", "cancelled", "cancelled"]
        assert fresh(run).status == "cancelled"

    def test_a_ctx_workflow_child_runs_on_its_parents_queue_and_priority(self) -> None:
        run = start_workflow(
            "test.parent", {"child": "test.double", "child_input": 4}, queue="bulk", priority=7
        )
        run_workflow(run.pk)
        child = WorkflowRun.objects.get(parent=run)
        assert (child.queue, child.priority, child.parent_step_id) == ("bulk", 7, None)

    def test_inline_drives_the_children_too(self) -> None:
        run = start_workflow(
            "test.fan_parent", {"inputs": [{"i": 0}, {"i": 1}], "max_parallel": 1}, inline=True
        )
        assert run.output == {"outputs": [{"shipped": 0}, {"shipped": 1}]}


class FanOutAdminTests(TransactionTestCase):
    def test_a_map_is_one_line_with_its_counts_and_a_link_to_its_items(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)
        items = [{"i": i, "fail": i == 3} for i in range(30)]
        run = start_workflow("test.map", {"items": items, "options": {"max_parallel": 4}})
        run_workflow(run.pk)
        for item in due_items(run)[:3]:
            run_workflow(item.pk)
        page = self.client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
        text = page.content.decode()
        assert "ctx.map items:" in text
        assert "30 items</a>, at most 4 at once — 27 pending · 0 running · 3 succeeded · 0 failed" in text
        step_id = WorkflowStep.objects.get(run=run, step_name="items").pk
        # Not one line per item.
        assert text.count("pikku_django.map_item") <= 1
        listing = self.client.get(
            reverse("admin:pikku_django_workflowrun_changelist") + f"?parent_step={step_id}"
        )
        assert listing.status_code == 200
        assert listing.context["cl"].result_count == 30
