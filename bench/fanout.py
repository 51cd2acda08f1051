"""
Fan-out against tasks: a ``ctx.map`` of no-op items through one
``pikku_worker`` process on its default options, beside as many no-op Django
tasks through the same worker in the same run; and the statements one
item's end sends, as the map grows.

    .venv/bin/python bench/fanout.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv/bin/python bench/fanout.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/bench .venv/bin/python bench/fanout.py

Each trial starts one worker (``pikku_worker -v 0``: four lanes, its sweep
and scheduler) and waits until it has connected. The tasks trial enqueues
``--items`` no-op tasks not yet due, makes them due in one UPDATE and starts
the clock; it stops when a poll (every 20 ms) finds every task finished.
The map trial starts one run that maps a no-op function over ``--items``
items (no ``max_parallel``) and stops when the run has completed: the
parent's pass that inserts the items, every item, and the parent's last
pass. ``--rounds`` trials of each, alternating; the median is shown. A
benchmark, not a test: the target (items/s at least half of tasks/s) is
printed, never asserted.

Statements per item end: in this process, the parent's first pass over a
map of N no-op items, then one item driven (``run_workflow``) with every
statement counted (``connection.execute_wrapper``), for N = 100, 1,000 and
``--largest`` (default 10,000).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from collections.abc import Callable

from _setup import migrate_if_needed  # noqa: E402  (first: sets Django up)
from _workers import start_worker, stop_worker, timed  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.noop_map import noop_task  # noqa: E402
from bench.steps import environment, positive_int  # noqa: E402
from pikku_django.models import Lease, WorkflowRun  # noqa: E402
from pikku_django.tasks.results import TASK_WORKFLOW  # noqa: E402
from pikku_django.workflows import run_workflow, start_workflow  # noqa: E402

WORKER = ["pikku_worker", "-v", "0", "--holder", "bench-fanout"]


def clear() -> None:
    WorkflowRun.objects.filter(workflow__in=["bench.map", TASK_WORKFLOW]).delete()
    Lease.objects.filter(key__startswith="workflow-run:").delete()


def trial_tasks(count: int) -> float:
    clear()
    later = noop_task.using(run_after=timezone.now() + datetime.timedelta(days=1))
    for _ in range(count):
        later.enqueue()
    proc = start_worker("bench.noop_map", WORKER)
    try:
        WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).update(wake_at=Lease.objects.db_now_ms())
        running = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="running")
        seconds = timed(lambda: not running.exists())
    finally:
        stop_worker(proc)
    assert WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="completed").count() == count
    clear()
    return count / seconds


def trial_map(count: int) -> float:
    clear()
    proc = start_worker("bench.noop_map", WORKER)
    try:
        run = start_workflow("bench.map", {"items": count})
        seconds = timed(lambda: WorkflowRun.objects.get(pk=run.pk).status != "running")
    finally:
        stop_worker(proc)
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, run.output) == ("completed", count), (run.status, run.error)
    clear()
    return count / seconds


def statements_per_item_end(count: int) -> int:
    """Statements one item's pass sends (its step, its end, the fan-in), for a map of ``count`` items."""
    clear()
    run = start_workflow("bench.map", {"items": count})
    run_workflow(run.pk)
    item = WorkflowRun.objects.filter(parent=run, parent_index=count // 2).get()
    statements = 0

    def counted(execute: Callable[..., object], *args: object) -> object:
        nonlocal statements
        statements += 1
        return execute(*args)

    with connection.execute_wrapper(counted):
        run_workflow(item.pk)
    clear()
    return statements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=positive_int, default=1000, help="items (and tasks) per trial")
    parser.add_argument("--rounds", type=positive_int, default=3, help="trials of each (default 3)")
    parser.add_argument("--largest", type=positive_int, default=10_000, help="the largest map counted")
    options = parser.parse_args()
    migrated = migrate_if_needed()
    others = WorkflowRun.objects.filter(status="running").exclude(workflow__in=["bench.map", TASK_WORKFLOW])
    if others.exists():
        raise SystemExit("runs are running in this database: point the bench at a scratch database")
    for line in environment([f"migrated: {migrated}", f"items per trial: {options.items}"]):
        print(line)
    tasks: list[float] = []
    items: list[float] = []
    for round_number in range(options.rounds):
        tasks.append(trial_tasks(options.items))
        items.append(trial_map(options.items))
        print(f"round {round_number + 1}: tasks {tasks[-1]:8.1f}/s, map items {items[-1]:8.1f}/s", flush=True)
    task_rate, item_rate = statistics.median(tasks), statistics.median(items)
    print()
    print("| one pikku_worker, default options | per second (median) |")
    print("|---|---:|")
    print(f"| no-op Django tasks | {task_rate:.1f} |")
    print(f"| no-op ctx.map items | {item_rate:.1f} |")
    print(f"\nitems/s / tasks/s: {item_rate / task_rate:.2f} (target >= 0.5)")
    sizes = sorted({100, 1000, options.largest})
    counts = ", ".join(f"{size}: {statements_per_item_end(size)}" for size in sizes)
    print(f"statements per item end, by map size: {counts}")


if __name__ == "__main__":
    sys.exit(main())
