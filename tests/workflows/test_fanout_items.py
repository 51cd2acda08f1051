"""An item of a halted fan-out is counted once: it cannot be retried on its own."""

from __future__ import annotations

import pytest
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowFanOut, WorkflowRun
from pikku_django.workflows import retry_workflow, run_workflow, start_workflow
from tests.workflows.test_fanout import drive_items, due_items, fresh, items_of


class HaltedItemTests(TransactionTestCase):
    def test_an_item_of_a_halted_map_is_refused_naming_its_parent(self) -> None:
        items = [{"i": i, "fail": i == 1} for i in range(5)]
        run = start_workflow("test.map", {"items": items, "options": {"max_parallel": 2, "retries": 0}})
        run_workflow(run.pk)
        first, second = due_items(run)
        run_workflow(second.pk)
        assert fresh(second).status == "failed"
        ended = WorkflowFanOut.objects.get().ended
        with pytest.raises(InvalidArgumentError, match=f"retry the parent run {run.pk}"):
            retry_workflow(second.pk)
        assert fresh(second).status == "failed"
        assert WorkflowFanOut.objects.get().ended == ended
        # The parent, woken once, sees the map fail once.
        assert run_workflow(run.pk).output == {"failed": "item 1 fails", "item": 1}
        assert [item.status for item in items_of(run)][:2] == ["cancelled", "failed"]
        assert first.pk != second.pk


class ReviveTests(TransactionTestCase):
    def test_reviving_the_parent_never_moves_a_running_item(self) -> None:
        items = [{"i": i, "fail_unless": "/nonexistent/gate" if i == 2 else None} for i in range(6)]
        run = start_workflow(
            "test.map_strict", {"items": items, "options": {"max_parallel": 2, "retries": 0}}
        )
        run_workflow(run.pk)
        drive_items(run)
        assert run_workflow(run.pk).status == "failed"
        # An item running again behind the fan-out's back (as a retry of the
        # item alone once could): the parent's retry leaves it running.
        runner = items_of(run)[3]
        WorkflowRun.objects.filter(pk=runner.pk).update(status="running", wake_at=0)
        assert retry_workflow(run.pk)
        assert fresh(runner).status == "running" and fresh(runner).wake_at == 0
        fan_out = WorkflowFanOut.objects.get()
        assert (fan_out.ended, fan_out.halted) == (2, False)
        # One slot of two is the running item's: one revived item is released.
        assert [item.parent_index for item in due_items(run)] == [2, 3]
