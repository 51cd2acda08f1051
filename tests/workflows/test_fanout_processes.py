"""
ctx.map and ctx.workflows across real ``pikku_worker`` processes: items
spread over workers, ``max_parallel`` held across all of them, a parent that
holds no lane, and workers SIGKILLed while items run.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import LONG_RUN_LEASE_MS, ProcessTestCase, status

pytestmark = pytest.mark.slow


def items_of(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent=run).order_by("parent_index"))


def most_at_once(calls: list[StepCall]) -> int:
    """The most items running at one instant, from their start and end records (half-open spans)."""
    events = sorted(
        (call.at_ms, -1 if call.step.startswith("end:") else 1)
        for call in calls
        if call.step.startswith(("start:", "end:"))
    )
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


def starts(index: int) -> list[StepCall]:
    return list(StepCall.objects.filter(step=f"start:{index}").order_by("at_ms"))


class MapProcessTests(ProcessTestCase):
    def finished(self, run: WorkflowRun, timeout: float = 90) -> WorkflowRun:
        poll_until(lambda: status(run) == "completed", timeout=timeout)
        return WorkflowRun.objects.get(pk=run.pk)

    def test_twenty_items_spread_over_three_workers_each_called_once_results_in_order(self) -> None:
        # Items 0 to 2 each wait until all three have started: a worker has
        # two lanes, so some other worker must take one of them.
        items = [{"i": i, "ms": 150, **({"after_starts": [0, 1, 2]} if i < 3 else {})} for i in range(20)]
        run = start_workflow("test.map", {"items": items})
        for name in ("a", "b", "c"):
            self.worker(name, "--concurrency", "2", "--interval", "0.05")
        run = self.finished(run)
        assert run.output == {"results": [i * 10 for i in range(20)], "sum": 1900}
        assert [len(starts(i)) for i in range(20)] == [1] * 20
        pids = set(StepCall.objects.filter(step__startswith="start:").values_list("pid", flat=True))
        assert len(pids) >= 2, pids
        # The parent's next step ran once, after every item.
        assert WorkflowStepAttempt.objects.filter(step__run=run, step__step_name="sum").count() == 1

    def test_max_parallel_holds_across_every_worker(self) -> None:
        items = [{"i": i, "ms": 200} for i in range(12)]
        run = start_workflow("test.map", {"items": items, "options": {"max_parallel": 3}})
        for name in ("a", "b", "c"):
            self.worker(name, "--concurrency", "3", "--interval", "0.05")
        self.finished(run)
        calls = list(StepCall.objects.all())
        # Never more than three at once, and the workers did run them side by side.
        assert 2 <= most_at_once(calls) <= 3, most_at_once(calls)

    def test_items_run_on_the_parents_queue_within_its_concurrency(self) -> None:
        env = subprocess_env(PIKKU_QUEUES=json.dumps({"bulk": {"concurrency": 2}}))
        items = [{"i": i, "ms": 200} for i in range(8)]
        run = start_workflow("test.map", {"items": items}, queue="bulk", priority=4)
        for name in ("a", "b"):
            self.worker(name, "--concurrency", "3", "--interval", "0.05", env=env)
        self.finished(run)
        assert {(item.queue, item.priority) for item in items_of(run)} == {("bulk", 4)}
        # Six lanes, eight items due at once, and never more than the queue's two.
        assert most_at_once(list(StepCall.objects.all())) <= 2

    def test_one_worker_with_one_lane_completes_a_map(self) -> None:
        run = start_workflow(
            "test.map", {"items": [{"i": i} for i in range(6)], "options": {"max_parallel": 2}}
        )
        self.worker("solo", "--concurrency", "1", "--interval", "0.05")
        assert self.finished(run, timeout=60).output["results"] == [0, 10, 20, 30, 40, 50]

    def test_a_spent_item_stops_new_items_and_the_step_fails_once_those_in_flight_end(self) -> None:
        # The failing item fails once the two beside it have begun (an item
        # not begun would be cancelled, rightly), however fast a pass is.
        items = (
            [{"i": 0, "fail": True, "after_starts": [1, 2]}]
            + [{"i": i, "ms": 1500} for i in range(1, 3)]
            + [{"i": i} for i in range(3, 8)]
        )
        run = start_workflow("test.map", {"items": items, "options": {"max_parallel": 3, "retries": 0}})
        self.worker("a", "--concurrency", "3", "--interval", "0.05")
        poll_until(lambda: status(run) == "completed", timeout=60)
        run = WorkflowRun.objects.get(pk=run.pk)
        assert run.output == {"failed": "item 0 fails", "item": 0}
        # The two in flight ran to their end; none of the rest ever started.
        assert [len(starts(i)) for i in range(8)] == [1, 1, 1, 0, 0, 0, 0, 0]
        assert StepCall.objects.filter(step__in=["end:1", "end:2"]).count() == 2
        assert [item.status for item in items_of(run)] == ["failed", "completed", "completed"] + [
            "cancelled"
        ] * 5
        end = max(call.at_ms for call in StepCall.objects.filter(step__in=["end:1", "end:2"]))
        step = WorkflowStep.objects.get(run=run, step_name="items")
        failed_at = WorkflowStepAttempt.objects.get(step=step).failed_at
        assert failed_at is not None and failed_at.timestamp() * 1000 >= end - 1

    def test_a_worker_killed_while_items_run_loses_only_its_own_items(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS)
        items = [{"i": i, "ms": 1200} for i in range(8)]
        run = start_workflow("test.map", {"items": items, "options": {"lease_ms": 3000}})
        victim = self.worker("victim", "--concurrency", "2", "--interval", "0.05", env=env)
        rescuer = self.worker(
            "rescuer", "--concurrency", "2", "--interval", "0.05", "--sweep-interval", "0.5", env=env
        )
        poll_until(
            lambda: StepCall.objects.filter(step__startswith="start:", pid=victim.pid).exists(), timeout=30
        )
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        run = self.finished(run)
        assert run.output["results"] == [i * 10 for i in range(8)]
        killed: set[int] = set()
        for i in range(8):
            calls = starts(i)
            # An item whose success the victim committed ran once. One it
            # started and did not commit (killed mid-function, or after its
            # end before the commit) ran again, once, on the rescuer.
            attempts = WorkflowStepAttempt.objects.filter(step__run_id=calls[0].run_id)
            committed_by_victim = attempts.filter(holder__startswith="victim", status="succeeded").exists()
            if calls[0].pid == victim.pid and not committed_by_victim:
                killed.add(i)
                assert len(calls) == 2 and calls[1].pid == rescuer.pid, (i, calls)
            else:
                assert len(calls) == 1, (i, calls)
        assert killed
        assert WorkflowStepAttempt.objects.filter(step__run=run, step__step_name="sum").count() == 1
        self.stop(rescuer, "rescuer")


class ChildrenProcessTests(ProcessTestCase):
    def test_five_children_two_at_a_time_survive_a_sigkill_right_after_their_start(self) -> None:
        env = subprocess_env(PIKKU_LEASE_TTL_MS=LONG_RUN_LEASE_MS, PIKKU_STEP_LEASE_MS="1500")
        marker = str(self.tmp / "killed")
        inputs: list[dict[str, Any]] = [{"i": 0, "kill": marker}] + [{"i": i, "ms": 100} for i in range(1, 5)]
        run = start_workflow("test.fan_parent", {"inputs": inputs, "max_parallel": 2})
        victim = self.worker("victim", "--concurrency", "1", "--interval", "0.05", env=env)
        assert victim.wait(timeout=60) == -signal.SIGKILL
        assert WorkflowRun.objects.filter(parent=run).count() == 5
        self.worker("rescuer", "--concurrency", "2", "--interval", "0.05", "--sweep-interval", "0.5", env=env)
        poll_until(lambda: status(run) == "completed", timeout=60)
        run = WorkflowRun.objects.get(pk=run.pk)
        assert run.output == {"outputs": [{"shipped": i} for i in range(5)]}
        # Still exactly five children, each called once but the killed one.
        children = items_of(run)
        assert len(children) == 5
        calls = [StepCall.objects.filter(run_id=child.pk, step="child").count() for child in children]
        assert calls == [2, 1, 1, 1, 1]
