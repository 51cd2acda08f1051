"""
The per-minute rollup (``store.rollup``): the outcomes a worker writes are
counted in it, per queue and workflow (a task under its own name), in the
transaction that records them, with their start delays; the sweep prunes
its rows past a day, a bounded number a pass.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from django.db.models import Sum
from django.test import TestCase, TransactionTestCase

from pikku_django.models import DELAY_COLUMNS, Lease, WorkflowMinute, WorkflowRun
from pikku_django.store import rollup
from pikku_django.store.lifecycle import time_out_runs
from pikku_django.sweep import sweep
from pikku_django.worker import Worker
from pikku_django.workflows import cancel_workflow, start_workflow
from testproject.testing import tasks
from tests.support.commits import LONE_TASK_COMMITS, counting_commits

#: How long a drain may take before the test gives up.
DRAIN_S = 30


def drain(worker: Worker) -> None:
    """Drive every due run to its end (children included), within ``DRAIN_S``."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        worker.run_batch()
        if not WorkflowRun.objects.filter(status__in=("running", "suspended")).exists():
            return
    raise AssertionError("the worker did not drain the runs in time")


def rolled_up() -> Counter[tuple[str, str, str]]:
    """What the rollup counted: (queue, name, status) to runs."""
    counted: Counter[tuple[str, str, str]] = Counter()
    sums = WorkflowMinute.objects.values("queue", "workflow").annotate(c=Sum("completed"), f=Sum("failed"))
    for row in sums:
        counted[row["queue"], row["workflow"], "completed"] += row["c"]
        counted[row["queue"], row["workflow"], "failed"] += row["f"]
    return +counted


def outcomes() -> Counter[tuple[str, str, str]]:
    """What the database holds: (queue, name, status) to runs, completed and failed."""
    counted: Counter[tuple[str, str, str]] = Counter()
    for run in WorkflowRun.objects.filter(status__in=rollup.COUNTED):
        task = run.input.get("task") if isinstance(run.input, dict) else None
        counted[run.queue, rollup.chart_name(run.workflow, task), run.status] += 1
    return counted


def delays() -> list[int]:
    """The rollup's delay buckets, summed over every row."""
    sums = WorkflowMinute.objects.aggregate(**{column: Sum(column) for column in DELAY_COLUMNS})
    return [sums[column] or 0 for column in DELAY_COLUMNS]


class RollupTests(TransactionTestCase):
    def test_the_rollup_counts_what_a_worker_drained(self) -> None:
        for i in range(5):
            tasks.add.enqueue(i, 1)
        for _ in range(3):
            tasks.explode.enqueue("no")
        for i in range(4):
            start_workflow("test.double", i, queue="mail")
        start_workflow("test.fails", None, queue="mail")
        start_workflow("test.parent", {"child": "test.fails"})
        start_workflow("test.parent", {"child": "test.double", "child_input": 2})
        drain(Worker(holder="w-rollup", concurrency=1, batch=50, interval=0.01))
        expected = outcomes()
        assert expected["default", "testproject.testing.tasks.add", "completed"] == 5
        assert expected["default", "testproject.testing.tasks.explode", "failed"] == 3
        assert expected["mail", "test.double", "completed"] == 4
        assert expected["mail", "test.fails", "failed"] == 1
        assert expected["default", "test.parent", "completed"] == 2
        assert rolled_up() == expected
        # One start delay per run ended by a pass that was due at a known time
        # (a parent woken by its child's end is taken out of turn: none).
        assert 0 < sum(delays()) <= sum(expected.values())

    def test_the_start_delay_is_counted_from_the_due_time(self) -> None:
        for i in range(3):
            tasks.add.enqueue(i, 1)
        now = Lease.objects.db_now_ms()
        WorkflowRun.objects.update(wake_at=now - 7_000)
        drain(Worker(holder="w-rollup", concurrency=1, batch=50, interval=0.01))
        # 7 s late, and under 10 s: the bucket up to 10 000 ms.
        counted = delays()
        assert counted[rollup.bucket(7_000)] == 3, counted
        assert rollup.bucket(7_000) == rollup.bucket(10_000) == rollup.bucket(9_999)
        assert sum(counted) == 3

    def test_a_run_timed_out_is_counted_failed(self) -> None:
        run = start_workflow("test.double", 1, queue="late")
        WorkflowRun.objects.filter(pk=run.pk).update(deadline_at=Lease.objects.db_now_ms() - 1)
        assert time_out_runs("default", [run.pk]) == 1
        assert rolled_up() == Counter({("late", "test.double", "failed"): 1})
        assert sum(delays()) == 0

    def test_cancelled_runs_are_not_counted(self) -> None:
        run = start_workflow("test.double", 1)
        cancel_workflow(run.pk)
        assert not WorkflowMinute.objects.exists()

    def test_a_lone_task_costs_no_commit_more(self) -> None:
        tasks.add.enqueue(2, 3)
        worker = Worker(holder="w-rollup", concurrency=1, interval=0.01)
        with counting_commits() as counter:
            assert worker.run_batch() == 1
        assert counter.commits == LONE_TASK_COMMITS, counter.report()
        assert rolled_up() == Counter({("default", "testproject.testing.tasks.add", "completed"): 1})


class RollupPruneTests(TestCase):
    def minute(self, minutes_ago: int, **counts: Any) -> WorkflowMinute:
        now = Lease.objects.db_now_ms()
        at = (now // 60_000 - minutes_ago) * 60_000
        return WorkflowMinute.objects.create(minute=at, queue="q", workflow=f"w{minutes_ago}", **counts)

    def test_the_sweep_prunes_rows_past_a_day_a_bounded_number_a_pass(self) -> None:
        kept = [self.minute(0, completed=1), self.minute(24 * 60, completed=1)]
        for n in range(5):
            self.minute(26 * 60 + n, failed=1)
        assert sweep(prune_limit=3, dry_run=True).pruned_minutes == 3
        assert WorkflowMinute.objects.count() == 7
        assert sweep(prune_limit=3).pruned_minutes == 3
        assert sweep(prune_limit=3).pruned_minutes == 2
        assert sweep(prune_limit=3).pruned_minutes == 0
        assert sorted(WorkflowMinute.objects.values_list("pk", flat=True)) == sorted(m.pk for m in kept)

    def test_rows_are_grouped_before_the_upsert(self) -> None:
        ends = [
            rollup.Ended("q", "w", "completed", 5),
            rollup.Ended("q", "w", "failed", None),
            rollup.Ended("q", "w", "completed", 20_000),
            rollup.Ended("q", "v", "completed", 0),
        ]
        rows = {(row["q"], row["w"]): row for row in rollup.rows(ends)}
        assert (rows["q", "w"]["c"], rows["q", "w"]["f"], rows["q", "w"]["d0"], rows["q", "w"]["d9"]) == (
            2,
            1,
            1,
            1,
        )
        rollup.add_within("default", ends)
        rollup.add_within("default", ends)
        # Summed, as the two may fall either side of a minute's end.
        sums = WorkflowMinute.objects.filter(workflow="w").aggregate(
            c=Sum("completed"), f=Sum("failed"), d0=Sum("delay_0"), d9=Sum("delay_9")
        )
        assert sums == {"c": 4, "f": 2, "d0": 2, "d9": 2}
        assert WorkflowMinute.objects.filter(workflow="v").aggregate(d0=Sum("delay_0")) == {"d0": 2}

    def test_names_outside_ascii_on_the_minute(self) -> None:
        rollup.add_within("default", [rollup.Ended("файлы", "отчёт", "completed", 1)])
        row = WorkflowMinute.objects.get()
        assert (row.queue, row.workflow, row.completed, row.failed) == ("файлы", "отчёт", 1, 0)
        assert row.minute % 60_000 == 0
        assert abs(Lease.objects.db_now_ms() - row.minute) < 2 * 60_000
