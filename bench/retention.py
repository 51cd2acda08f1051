"""
The hot path with a large history kept (issue 17, "Measure"): the worker's
due query (p50/p99) and no-op workflow runs/s on an empty history and with
``--finished`` finished runs (``--steps`` steps each) retained, then one
prune pass of ``--prune`` runs. A benchmark, not a test: nothing is asserted.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/retention.py

Point it at a scratch database: it deletes every run of its own workflows
(``bench.retention``) before and after.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
import uuid

import _setup  # noqa: F401  (Django set up, repo root on sys.path)
from django.db import connection
from django.test.utils import override_settings

from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import prune_runs
from pikku_django.workflows import run_workflow, start_workflow

HISTORY = "bench.retention"


def clean() -> None:
    WorkflowRun.objects.filter(workflow=HISTORY).delete()
    WorkflowRun.objects.filter(workflow="test.noop").delete()


def due_query_ms(samples: int) -> tuple[float, float]:
    """p50 and p99 of the worker's due query (``next_due``), with a small backlog due."""
    runs = WorkflowRun.objects.get_queryset()
    took = []
    for _ in range(samples):
        start = time.perf_counter()
        runs.next_due(10)
        took.append((time.perf_counter() - start) * 1000)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.99) - 1]


def noop_runs_per_s(count: int) -> float:
    """Runs of a one-step no-op workflow started and driven to their end, per second, in one process."""
    start = time.perf_counter()
    for _ in range(count):
        run = start_workflow("test.noop", {"steps": 1})
        run_workflow(run.pk)
    return count / (time.perf_counter() - start)


def fill(finished: int, steps: int, chunk: int = 5_000) -> float:
    """Insert ``finished`` completed runs, a month old, with ``steps`` succeeded steps each; seconds taken."""
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
    started = time.perf_counter()
    for first in range(0, finished, chunk):
        runs = [
            WorkflowRun(
                id=uuid.uuid4(),
                workflow=HISTORY,
                status="completed",
                output=1,
                created_at=old,
                updated_at=old + datetime.timedelta(microseconds=i),
            )
            for i in range(first, min(first + chunk, finished))
        ]
        WorkflowRun.objects.bulk_create(runs)
        rows = [
            WorkflowStep(
                run=run,
                step_name=f"s{n}",
                rpc_name="bench.step",
                status="succeeded",
                result=n,
                retries=0,
                attempt=1,
                created_at=old,
                updated_at=old,
            )
            for run in runs
            for n in range(steps)
        ]
        WorkflowStep.objects.bulk_create(rows)
        WorkflowStepAttempt.objects.bulk_create(
            WorkflowStepAttempt(step=s, attempt=1, status="succeeded", created_at=old) for s in rows
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return time.perf_counter() - started


def measure(label: str, samples: int, runs: int) -> None:
    backlog = [WorkflowRun.objects.create_run(HISTORY) for _ in range(50)]
    p50, p99 = due_query_ms(samples)
    WorkflowRun.objects.filter(pk__in=[r.pk for r in backlog]).delete()
    rate = noop_runs_per_s(runs)
    print(f"{label:<34} due query p50 {p50:6.3f} ms  p99 {p99:6.3f} ms   no-op runs/s {rate:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--finished", type=int, default=100_000, help="finished runs kept (default %(default)s)"
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per finished run (default %(default)s)")
    parser.add_argument("--samples", type=int, default=2_000, help="due queries timed (default %(default)s)")
    parser.add_argument("--runs", type=int, default=200, help="no-op runs timed (default %(default)s)")
    parser.add_argument(
        "--prune", type=int, default=1_000, help="runs in the prune pass (default %(default)s)"
    )
    options = parser.parse_args()
    _setup.migrate_if_needed()
    print(f"{_setup.revision()} on {connection.vendor}")
    clean()
    try:
        measure("empty history", options.samples, options.runs)
        seconds = fill(options.finished, options.steps)
        kept = f"{options.finished:,} finished runs, {options.finished * options.steps:,} steps"
        print(f"(inserted {kept} in {seconds:.1f} s)")
        measure(kept, options.samples, options.runs)
        with override_settings(PIKKU_RETENTION_MS={"completed": 86_400_000}):
            start = time.perf_counter()
            pruned = prune_runs(options.prune)
            took = time.perf_counter() - start
        print(f"prune pass: {pruned:,} runs (with their steps and attempts) in {took * 1000:.0f} ms")
    finally:
        clean()


if __name__ == "__main__":
    main()
