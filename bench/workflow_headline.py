"""
The headline table of ``bench/workflows.py`` (issue #9): a workflow of 10
steps whose bodies do no I/O (``test.noop``), 200 runs, driven by 1 and by 2
``manage.py pikku_worker`` processes on Django's default database settings,
next to the floor measured in the same run: two one-row durable UPDATEs by
primary key in autocommit, the two commits a step needs.

Statements and commits per step are counted in this process on one run of
10 steps and one of 0 (the difference is the steps' share), driven by the
worker loop itself, and again when the same runs are replayed. A commit is a
statement that writes in autocommit, or a COMMIT (sent by the runtime, or by
Django closing an ``atomic()`` block).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow

WORKFLOW = "test.noop"
STEPS = 10
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def writes(words: str) -> bool:
    """Does this statement (upper-cased) write?"""
    return words.startswith(WRITES) or (words.startswith("WITH") and any(w in words for w in WRITES))


class CommitCounter:
    """An ``execute_wrapper`` counting statements, and durable commits among them."""

    def __init__(self) -> None:
        self.statements = 0
        self.commits = 0
        self._explicit = False

    def __call__(
        self, execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        self.statements += 1
        words = sql_text.lstrip().upper()
        if words.startswith("START TRANSACTION") and words.rstrip().endswith("COMMIT"):
            self.commits += 1  # a whole transaction in one round trip (MySQL/MariaDB)
        elif words.startswith(("START TRANSACTION", "BEGIN")):
            self._explicit = True
        elif words.startswith(("COMMIT", "ROLLBACK")):
            self.commits += int(words.startswith("COMMIT") and self._explicit)
            self._explicit = False
        elif not self._explicit and not context["connection"].in_atomic_block and writes(words):
            # In autocommit, a statement that writes is a commit of its own.
            self.commits += 1
        return execute(sql_text, params, many, context)


@contextmanager
def counting() -> Iterator[CommitCounter]:
    counter = CommitCounter()
    wrapper = connections[DEFAULT_DB_ALIAS]
    real_commit = wrapper._commit

    def commit() -> None:
        counter.commits += 1
        counter._explicit = False
        real_commit()

    wrapper.__dict__["_commit"] = commit
    try:
        with wrapper.execute_wrapper(counter):
            yield counter
    finally:
        wrapper.__dict__.pop("_commit", None)


def _drive_one(run_id: Any) -> CommitCounter:
    WorkflowRun.objects.filter(pk=run_id).update(status="running", wake_at=0, output=None)
    worker = Worker(once=True, batch=1)
    with counting() as counter:
        worker.run_batch()
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    return counter


@dataclass
class Counts:
    """Statements and commits per step (first run, replay) and per run pass."""

    first_statements: float
    first_commits: float
    replay_statements: float
    replay_commits: float
    run_statements: int
    run_commits: int


def count_per_step() -> Counts:
    ids = []
    results = {}
    for steps in (0, STEPS):
        run = start_workflow(WORKFLOW, {"steps": steps})
        ids.append(run.pk)
        first = _drive_one(run.pk)
        replay = _drive_one(run.pk)
        results[steps] = (first, replay)
    drop_runs(ids)
    (empty, empty_replay), (full, full_replay) = results[0], results[STEPS]
    return Counts(
        (full.statements - empty.statements) / STEPS,
        (full.commits - empty.commits) / STEPS,
        (full_replay.statements - empty_replay.statements) / STEPS,
        (full_replay.commits - empty_replay.commits) / STEPS,
        empty.statements,
        empty.commits,
    )


def floor_pair_us(pairs: int = 300, rounds: int = 3) -> float:
    """Two one-row durable UPDATEs by primary key in autocommit, us per pair (median round)."""
    key = "bench:floor"
    Lease.objects.filter(key=key).delete()
    Lease.objects.create(key=key, holder="bench", token=1, expires_at=0)
    table = connection.ops.quote_name(Lease._meta.db_table)
    text = f"UPDATE {table} SET {connection.ops.quote_name('expires_at')} = %s WHERE {connection.ops.quote_name('key')} = %s"  # noqa: E501
    value = 0
    samples = []
    with connection.cursor() as cursor:
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(pairs * 2):
                value += 1
                cursor.execute(text, [value, key])
            samples.append((time.perf_counter() - started) / pairs * 1e6)
    Lease.objects.filter(key=key).delete()
    return statistics.median(samples)


def create_runs(count: int) -> list[Any]:
    ids = [start_workflow(WORKFLOW, {"steps": STEPS}).pk for _ in range(count)]
    WorkflowRun.objects.filter(pk__in=ids).update(wake_at=None)
    return ids


def check_runs(ids: list[Any]) -> str:
    completed = WorkflowRun.objects.filter(pk__in=ids, status="completed", output=sum(range(STEPS))).count()
    steps = WorkflowStep.objects.filter(run_id__in=ids, status="succeeded", attempt=1).count()
    return f"{completed}/{len(ids)} runs completed; {steps}/{len(ids) * STEPS} steps succeeded on attempt 1"


def drop_runs(ids: list[Any]) -> None:
    from bench.workflows import drop_runs as drop

    drop(ids)


def table(
    trials: list[tuple[int, float, float, str]], floors: list[float], counts: Counts, vendor: str
) -> list[str]:
    """``trials``: (workers, seconds, floor us per pair measured beside it, check)."""
    floor = statistics.median(floors)
    head = (
        f"{'database':<10} {'workers':>7} {'steps/s':>8} {'us/step':>8} {'floor us':>8} "
        f"{'of floor':>8}  check"
    )
    lines = [head, "-" * len(head)]
    medians: dict[int, list[float]] = {}
    for workers, seconds, beside, check in trials:
        rate = STEPS * RUNS_PER_TRIAL[0] / seconds
        us = 1e6 / rate
        medians.setdefault(workers, []).append(rate)
        lines.append(
            f"{vendor:<10} {workers:>7} {rate:>8.0f} {us:>8.0f} {beside:>8.0f} {beside / us:>8.2f}  {check}"
        )
    lines.append("-" * len(head))
    for workers, rates in sorted(medians.items()):
        rate = statistics.median(rates)
        lines.append(
            f"{vendor:<10} {workers:>7} {rate:>8.0f} {1e6 / rate:>8.0f} {floor:>8.0f} "
            f"{floor * rate / 1e6:>8.2f}  median of {len(rates)}"
        )
    lines.append("")
    lines.append(
        f"per first-run step: {counts.first_statements:.2f} statements, {counts.first_commits:.2f} commits; "
        f"per replayed step: {counts.replay_statements:.2f} statements, {counts.replay_commits:.2f} commits; "
        f"per run pass (worker's due query, take and read of the run, run lease, steps read, outcome): "
        f"{counts.run_statements} statements, {counts.run_commits} commits"
    )
    lines.append(
        "floor: two one-row durable UPDATEs by primary key in autocommit, us per pair (the two commits "
        "a step needs), measured before and after each trial (beside a trial: their mean; beside the "
        "medians: the median of all); 'of floor' = floor us / us per step"
    )
    return lines


#: Set by bench/workflows.py: runs per trial.
RUNS_PER_TRIAL = [200]
