"""
No-op Django Tasks per second through one worker process: ``PikkuTaskBackend``
and ``manage.py pikku_worker`` next to django-tasks-db's ``DatabaseBackend``
and ``manage.py db_worker``, on the same database in the same run, and the
two-commit floor.

    .venv-bench/bin/python bench/tasks.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv-bench/bin/python bench/tasks.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/bench .venv-bench/bin/python bench/tasks.py

It needs django-tasks-db beside this app, in the bench's environment only
(see bench/README.md, "Tasks benchmark"): ``pip install -e '.[test,tasks]'
'Django>=5.2,<6' django-tasks-db``. Settings: ``bench.tasks_settings`` (the
test project's, plus ``django_tasks_db`` and its backend as ``tdb``).

Each trial enqueues ``--tasks`` no-op tasks not yet due (``run_after`` a day
ahead), starts one worker (``pikku_worker --interval 0.05 --batch 20 -v 0``,
or ``db_worker --backend tdb --interval 0.05 --no-startup-delay -v 0``),
waits until it has connected to the database, makes every task due in one
UPDATE and starts the clock; it stops when a poll (every 20 ms) finds every
task finished. The worker is stopped with SIGTERM and the rows deleted.
``--rounds`` trials of each, alternating; the median is shown.

The floor: what a task costs at the least when its claim and its result are
two durable commits: two autocommit single-row UPDATEs of one row, timed in
this process, as tasks per second.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import time
from collections.abc import Callable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.tasks_settings")

from _setup import migrate_if_needed  # noqa: E402  (first: sets Django up)
from _workers import start_worker as start_bench_worker  # noqa: E402
from _workers import stop_worker, timed  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.noop_tasks import noop, noop_tdb  # noqa: E402
from bench.steps import environment, positive_int  # noqa: E402
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt  # noqa: E402
from pikku_django.tasks.results import TASK_WORKFLOW  # noqa: E402

DAY = datetime.timedelta(days=1)


def start_worker(args: list[str]) -> subprocess.Popen[str]:
    """A worker (``manage.py args…``) with bench/noop_tasks.py imported, once connected."""
    return start_bench_worker("bench.noop_tasks", args)


# ---------------------------------------------------------------------------
# The two systems
# ---------------------------------------------------------------------------


def clear_pikku() -> None:
    runs = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW)
    WorkflowStepAttempt.objects.filter(step__run__in=runs).delete()
    WorkflowStep.objects.filter(run__in=runs).delete()
    Lease.objects.filter(key__startswith="workflow-run:").delete()
    runs.delete()


def trial_pikku(count: int) -> tuple[float, str]:
    clear_pikku()
    later = noop.using(run_after=timezone.now() + DAY)
    for _ in range(count):
        later.enqueue()
    proc = start_worker(
        ["pikku_worker", "--interval", "0.05", "--batch", "20", "-v", "0", "--holder", "bench"]
    )
    try:
        WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).update(wake_at=Lease.objects.db_now_ms())
        seconds = timed(
            lambda: not WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="running").exists()
        )
    finally:
        stop_worker(proc)
    completed = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="completed").count()
    attempts = WorkflowStepAttempt.objects.filter(
        step__run__workflow=TASK_WORKFLOW, status="succeeded"
    ).count()
    clear_pikku()
    return seconds, f"{completed}/{count} SUCCESSFUL, {attempts} attempts"


def trial_tdb(count: int) -> tuple[float, str]:
    from django_tasks_db.models import DBTaskResult

    DBTaskResult.objects.all().delete()
    later = noop_tdb.using(run_after=timezone.now() + DAY)
    for _ in range(count):
        later.enqueue()
    proc = start_worker(
        ["db_worker", "--backend", "tdb", "--interval", "0.05", "--no-startup-delay", "-v", "0"]
    )
    try:
        DBTaskResult.objects.update(run_after=timezone.now() - datetime.timedelta(seconds=1))
        seconds = timed(
            lambda: not DBTaskResult.objects.exclude(status__in=["SUCCESSFUL", "FAILED"]).exists()
        )
    finally:
        stop_worker(proc)
    done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    DBTaskResult.objects.all().delete()
    return seconds, f"{done}/{count} SUCCESSFUL"


def floor_two_commits(seconds: float = 2.0) -> float:
    """Tasks per second if each task were exactly two durable single-row commits."""
    key = "bench:tasks-floor"
    Lease.objects.filter(key=key).delete()
    Lease.objects.create(key=key, holder="bench", token=1, expires_at=0)
    table = connection.ops.quote_name(Lease._meta.db_table)
    text = f"UPDATE {table} SET expires_at = %s WHERE {connection.ops.quote_name('key')} = %s"  # noqa: S608
    pairs = 0
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while time.perf_counter() - started < seconds:
            cursor.execute(text, [pairs * 2 + 1, key])
            cursor.execute(text, [pairs * 2 + 2, key])
            pairs += 1
    elapsed = time.perf_counter() - started
    Lease.objects.filter(key=key).delete()
    return pairs / elapsed


def statements_per_task(count: int = 20) -> str:
    """What one pikku_worker pass over a no-op task sends, counted in this process."""
    from pikku_django.worker.process import Worker

    clear_pikku()
    for _ in range(count):
        noop.enqueue()
    kinds: dict[str, int] = {}

    def count_statement(
        execute: Callable[..., object], text: str, params: object, many: bool, context: object
    ) -> object:
        verb = text.lstrip().lstrip("(").split(None, 1)[0].upper()
        kind = "write" if verb in {"INSERT", "UPDATE", "DELETE", "WITH"} else verb.lower()
        kinds[kind] = kinds.get(kind, 0) + 1
        return execute(text, params, many, context)

    with connection.execute_wrapper(count_statement):
        Worker(holder="bench", once=True, interval=0.01).run()
    clear_pikku()
    return ", ".join(f"{n / count:.1f} {kind}" for kind, n in sorted(kinds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=positive_int, default=500, help="tasks per trial (default 500)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="trials of each (default 3)")
    options = parser.parse_args()
    migrated = migrate_if_needed()
    if WorkflowRun.objects.filter(status="running").exclude(workflow=TASK_WORKFLOW).exists():
        raise SystemExit("runs are running in this database: point the bench at a scratch database")
    for line in environment([f"migrated: {migrated}", f"tasks per trial: {options.tasks}"]):
        print(line)
    results: dict[str, list[float]] = {"pikku": [], "tdb": []}
    checks: dict[str, str] = {}
    for round_number in range(options.rounds):
        for name, trial in (("pikku", trial_pikku), ("tdb", trial_tdb)):
            seconds, check = trial(options.tasks)
            results[name].append(options.tasks / seconds)
            checks[name] = check
            print(
                f"round {round_number + 1}: {name:5} {options.tasks / seconds:8.1f} tasks/s ({check})",
                flush=True,
            )
    floor = statistics.median(floor_two_commits() for _ in range(options.rounds))
    pikku, tdb = statistics.median(results["pikku"]), statistics.median(results["tdb"])
    print()
    print("| one worker process, no-op task | tasks/s (median) | vs two-commit floor |")
    print("|---|---:|---:|")
    print(f"| PikkuTaskBackend + pikku_worker | {pikku:.1f} | {pikku / floor:.2f} |")
    print(f"| django-tasks-db DatabaseBackend + db_worker | {tdb:.1f} | {tdb / floor:.2f} |")
    print(f"| floor: two durable single-row commits per task | {floor:.1f} | 1.00 |")
    print(f"\npikku / django-tasks-db: {pikku / tdb:.2f}x")
    print(f"pikku_worker statements per task (in-process, execute_wrapper): {statements_per_task()}")


if __name__ == "__main__":
    main()
