"""
What a fork copies besides its steps: the stream items and events the
original had written at the fork point, so the fork's readers see one dense
stream from offset 0 and the fork, running on, publishes nothing twice.
"""

from __future__ import annotations

from typing import Any

from django.test import TransactionTestCase

from pikku_django.models import WorkflowEvent, WorkflowRun, WorkflowStep, WorkflowStreamItem
from pikku_django.workflows import fork_workflow, read_stream, run_workflow, send_signal, start_workflow


def items(run: WorkflowRun, stream: str = "log") -> list[tuple[int, Any]]:
    rows = WorkflowStreamItem.objects.filter(run=run, stream=stream).order_by("offset")
    return list(rows.values_list("offset", "item"))


def events(run: WorkflowRun) -> dict[str, Any]:
    return dict(WorkflowEvent.objects.filter(run=run).values_list("key", "value"))


def chunk_items(chunks: int) -> list[tuple[int, Any]]:
    """test.chunks' stream: per chunk, its step's two lines, then the workflow's item."""
    expected: list[tuple[int, Any]] = []
    for i in range(chunks):
        expected += [(3 * i, "line 0"), (3 * i + 1, "line 1"), (3 * i + 2, {"chunk": i})]
    return expected


def publish_offsets(run: WorkflowRun) -> dict[str, Any]:
    steps = WorkflowStep.objects.filter(run=run, rpc_name="pikku.publish")
    return dict(steps.values_list("step_name", "result"))


class ForkCopiesWhatWasToldTests(TransactionTestCase):
    def test_a_fork_from_a_step_starts_with_the_items_and_events_written_before_it(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 3}, inline=True)
        assert run.status == "completed" and items(run) == chunk_items(3)
        fork = fork_workflow(run.pk, from_step="chunk-1")
        # Chunk 0's step lines and the workflow's item; status as it stood
        # (set again later, so from its step); progress only a step set, and
        # later again, so it is not known at the fork point.
        assert items(fork) == chunk_items(1)
        assert events(fork) == {"status": {"done": 1}}
        assert list(read_stream(fork.pk, "log", timeout_ms=0)) == chunk_items(1)
        fork = run_workflow(fork.pk)
        assert fork.status == "completed", fork.error
        # Running on, the fork publishes each later item once, at the original's offsets.
        assert items(fork) == items(run)
        assert events(fork) == events(run) == {"status": {"done": 3}, "progress": {"lines": 2}}
        assert publish_offsets(fork) == publish_offsets(run)

    def test_a_fork_from_a_publish_step_publishes_that_item_again(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 3}, inline=True)
        fork = fork_workflow(run.pk, from_step="publish:log#2")
        # Chunk 1's step is copied, and its lines with it; its item is published again.
        assert items(fork) == chunk_items(2)[:5]
        assert events(fork) == {"status": {"done": 1}}
        assert run_workflow(fork.pk).status == "completed"
        assert items(fork) == chunk_items(3)

    def test_an_event_nothing_set_again_keeps_its_row_s_value(self) -> None:
        run = run_workflow(start_workflow("test.emits", {"before": 3, "after": 2}).pk)
        assert run.status == "suspended"
        fork = fork_workflow(run.pk, from_step="go")
        assert items(fork) == [(i, {"i": i}) for i in range(3)]
        assert events(fork) == {"status": {"done": 3}}
        assert run_workflow(fork.pk).status == "suspended"
        assert len(items(fork)) == 3
        send_signal(fork.pk, "go")
        fork = run_workflow(fork.pk)
        assert fork.output == {"offsets": [0, 1, 2, 3, 4]}
        assert items(fork) == [(i, {"i": i}) for i in range(5)]
        # The original is left as it was.
        assert items(run) == [(i, {"i": i}) for i in range(3)]

    def test_a_fork_of_a_fork_is_cut_in_the_order_the_first_fork_copied(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 3}, inline=True)
        first = fork_workflow(run.pk, from_step="chunk-2")
        assert items(first) == chunk_items(2)
        second = fork_workflow(first.pk, from_step="chunk-1")
        assert items(second) == chunk_items(1)
        assert events(second) == {"status": {"done": 1}}
        assert run_workflow(second.pk).status == "completed"
        assert items(second) == chunk_items(3)

    def test_a_fork_from_the_start_has_no_items_or_events(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 2}, inline=True)
        fork = fork_workflow(run.pk)
        assert items(fork) == [] and events(fork) == {}
        assert run_workflow(fork.pk).status == "completed"
        assert items(fork) == chunk_items(2)
