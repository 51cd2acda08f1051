"""
Keys of a fan-out's children (``ctx.map(..., key=)``, ``ctx.workflows(..., key=)``):
a string, or a function of each item (or input), giving each child run its
flow-control key; the queue's per-key concurrency holds across the items.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import Lease, WorkflowRun
from pikku_django.queues import key_slot_keys
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from pikku_django.workflows.fanout_items import item_keys
from tests.support.factories import lapse

PER_KEY = {"sync": {"per_key": {"concurrency": 1}}}


def children(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent=run).order_by("parent_index"))


@override_settings(PIKKU_QUEUES=PER_KEY)
class FanOutKeyTests(TransactionTestCase):
    def test_each_map_item_runs_under_its_key_and_a_full_key_holds_its_items(self) -> None:
        (slot,) = key_slot_keys("sync", "tenant:busy", 1)
        Lease.objects.acquire(slot, "dead", 60_000)
        items = [{"tenant": "busy" if i % 2 else f"t{i}", "n": i} for i in range(6)]
        run = start_workflow("test.keyed_map", {"items": items}, queue="sync")
        Worker(holder="w", once=True).run()
        kids = children(run)
        assert [kid.key for kid in kids] == [f"tenant:{item['tenant']}" for item in items]
        # Every item of a free key ran; the full key's items wait, and so does the parent.
        assert [kid.status for kid in kids] == ["completed", "running"] * 3
        assert not WorkflowRun.objects.get(pk=run.pk).is_finished
        # The dead holder's slot lapses: the key's items run and the parent ends.
        lapse(slot)
        WorkflowRun.objects.filter(parent=run, status="running").update(wake_at=0)
        Worker(holder="w2", once=True).run()
        finished = WorkflowRun.objects.get(pk=run.pk)
        assert (finished.status, finished.output) == ("completed", list(range(6)))

    def test_each_child_of_workflows_gets_the_key_of_its_input(self) -> None:
        inputs = [{"tenant": t, "i": i} for i, t in enumerate("abab")]
        run = start_workflow("test.keyed_children", {"inputs": inputs}, queue="sync")
        Worker(holder="w", once=True).run()
        assert [kid.key for kid in children(run)] == ["tenant:a", "tenant:b", "tenant:a", "tenant:b"]
        finished = WorkflowRun.objects.get(pk=run.pk)
        assert (finished.status, finished.output) == ("completed", inputs)


class ItemKeyTests(SimpleTestCase):
    def test_a_key_is_a_string_for_all_or_a_function_of_each_item(self) -> None:
        assert item_keys(None, [1, 2]) is None
        assert item_keys("k", [1, 2]) == ["k", "k"]
        assert item_keys(lambda item: f"n:{item}", [1, 2]) == ["n:1", "n:2"]

    def test_a_bad_key_is_refused_naming_its_item(self) -> None:
        with pytest.raises(InvalidArgumentError, match="key of item 1"):
            item_keys(lambda item: item, ["ok", ""])
        bad: Any = 3
        with pytest.raises(InvalidArgumentError, match="key"):
            item_keys(bad, [1])
