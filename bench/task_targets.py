"""
Issue 14's measures of the task path, in one run per database: one
``pikku_worker`` process on its default options next to django-tasks-db's
``db_worker`` on its own, a worker's wake-up and idle cost, and the durable
commits a task costs.

    DATABASE_URL=sqlite:////tmp/bench14.sqlite3 .venv-bench/bin/python bench/task_targets.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench14 .venv-bench/bin/python bench/task_targets.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/bench14 .venv-bench/bin/python bench/task_targets.py

It needs django-tasks-db beside this app, in the bench's environment only
(bench/README.md, "Tasks benchmark"), and a scratch database: it refuses
one where other workflow runs are running, and deletes its own rows. On
PostgreSQL it creates the ``pg_walinspect`` extension in that database (it
needs a superuser). Settings: ``bench.tasks_settings``. A benchmark, not a
test: the targets are printed next to the figures, never asserted.

The figures, in the order they are taken:

4. **Idle worker.** One ``pikku_worker -v 0 --holder NAME`` (four lanes,
   its sweep, scheduler and, on PostgreSQL, listener), started and left
   alone 3 s, then watched for ``--idle`` seconds (10) while this process
   sends nothing to the bench database. Counted in the worker process
   (bench/worker_counts.py: statements by kind, and durable commits) and on
   the server: PostgreSQL ``pg_stat_database`` of the bench database
   (transactions committed, rows returned and fetched, rows inserted,
   updated and deleted), read on a connection to the ``postgres`` database
   so that the reads are not counted, at the window's two ends (a backend
   flushes its counts when a transaction ends at least 1 s after its last
   flush; the worker's loops end one a second or less often, so the lag is
   under a second at both ends); MariaDB ``SHOW GLOBAL STATUS`` (Com_select,
   Com_insert/update/delete, Com_commit, Handler_write/update/delete): server-wide,
   so every other client of the server is in it too, and the number of
   other connections is printed beside it. SQLite: in-process only.
3. **Wake-up.** With the same worker idle, ``--wakeups`` (40) no-op tasks
   enqueued one at a time (``noop.enqueue()`` in ``transaction.atomic()``:
   its two INSERTs commit together, with the NOTIFY), each once the
   previous one has finished and a further 0.2 to 1.2 s have passed (a
   seeded random gap, so that the enqueues fall at every phase of the
   lanes' 1 s poll). The enqueue's commit is read on the database clock
   right after ``enqueue()`` returns (PostgreSQL ``clock_timestamp()``,
   MariaDB ``UTC_TIMESTAMP(6)``, SQLite this host's clock, which is the one
   SQLite's "now" reads); the start is the attempt's ``running_at``, written
   on the same clock by the statement that claims the step. p50 and p99 of
   the difference. The commit read is one round trip late, so the figures
   are low by up to one round trip (a fraction of a millisecond).
5. **Commits of a lone task.** With the same worker idle, ``--lone`` (5)
   no-op tasks, one at a time, each enqueued once the worker has been idle
   1 s: the worker's durable commits from just before the enqueue until the
   task has finished (in-process, as above), and on PostgreSQL the
   commit records in the write-ahead log of transactions that wrote to the
   bench database (``pg_walinspect``, counting subtransactions with their
   top transaction), less the enqueue's own (its transaction id is read
   inside it). Median of the tasks. MariaDB: the server-wide ``Com_commit``
   delta, less the enqueue's own COMMIT, beside the in-process count: every
   COMMIT statement, read-only transactions' too, and no autocommitted write
   (``Handler_commit`` counts every autocommitted SELECT, and InnoDB's
   ``trx_rw_commits`` is off unless enabled server-wide).
1. **No-op tasks, and commits at saturation.** ``--tasks`` (10,000) no-op
   tasks enqueued not yet due (``run_after`` a day ahead, in transactions of
   500), then made due in one UPDATE (which also wakes the worker at once on
   PostgreSQL, as an enqueue would); the clock runs from that commit until a
   poll (every 20 ms) finds every task finished: it reads the last task
   enqueued by its key until that one has finished, and only then looks for
   any task left (``remaining``), so that it loads the server alike however
   long the backlog. Through the same
   ``pikku_worker``, then through a fresh ``db_worker --backend tdb -v 0``
   (its defaults: a 1 s interval and a startup delay, taken before the
   clock starts). Commits per task are counted over the drain as above,
   for both workers (in-process, and on PostgreSQL in the log; on MariaDB
   the server-wide ``Com_commit``, less the UPDATE's).
2. **Tasks that wait 50 ms.** ``--waits`` (200) tasks that each sleep 50 ms,
   through a fresh ``pikku_worker -v 0 --concurrency 16``: tasks/s and its
   fraction of the ideal 16 / 50 ms = 320/s, from the commit that makes them
   due until the last has finished ("wall", which includes the wake-up on
   MariaDB and SQLite, where nothing crosses processes but the poll), and
   from the first attempt's ``running_at`` to the last's ``succeeded_at``
   on the database clock ("drain").

The in-process counters cost a few microseconds per statement, in both
workers alike.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.tasks_settings")

from _setup import migrate_if_needed  # noqa: E402  (first: sets Django up)
from _workers import start_worker, stop_worker  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max, Min  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.noop_tasks import noop, noop_tdb, sleep_50ms  # noqa: E402
from bench.steps import environment, positive_int  # noqa: E402
from pikku_django import wakeups  # noqa: E402
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt  # noqa: E402
from pikku_django.tasks.results import TASK_WORKFLOW  # noqa: E402

DAY = datetime.timedelta(days=1)
MODULE = "bench.worker_counts"
PIKKU = ["pikku_worker", "-v", "0", "--holder", "bench-targets"]
TDB = ["db_worker", "--backend", "tdb", "-v", "0"]
ENQUEUE_BATCH = 500
IDEAL_WAITS_PER_S = 16 / 0.05


def vendor() -> str:
    return connection.vendor


# ---------------------------------------------------------------------------
# Counting in the worker process
# ---------------------------------------------------------------------------


class CountedWorker:
    """A worker process with bench/worker_counts.py counting in it."""

    def __init__(self, args: list[str]) -> None:
        handle, name = tempfile.mkstemp(prefix="bench-counts-", suffix=".jsonl")
        os.close(handle)
        self.path = Path(name)
        self.proc = start_worker(MODULE, args, env={"BENCH_COUNTS": name})

    def snapshot(self) -> dict[str, int]:
        """The worker's totals so far (it appends a line on SIGUSR1)."""
        lines = len(self.path.read_text().splitlines())
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while True:
            now = self.path.read_text().splitlines()
            if len(now) > lines:
                return dict(json.loads(now[-1]))
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not answer SIGUSR1")
            time.sleep(0.005)

    def stop(self) -> None:
        stop_worker(self.proc)
        self.path.unlink(missing_ok=True)


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after`` less ``before``, key by key (``commits_by`` too, leaving out what did not change)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            changed = {k: n - before.get(key, {}).get(k, 0) for k, n in value.items()}
            out[key] = {k: n for k, n in changed.items() if n}
        else:
            out[key] = value - before.get(key, 0)
    return out


# ---------------------------------------------------------------------------
# Counting on the server
# ---------------------------------------------------------------------------


def side_connection() -> Any:
    """A raw connection to the server that is not to the bench database (its reads count nowhere)."""
    params = connection.settings_dict
    if vendor() == "postgresql":
        import psycopg

        return psycopg.connect(
            host=params["HOST"] or None,
            port=params["PORT"] or None,
            user=params["USER"] or None,
            password=params["PASSWORD"] or None,
            dbname="postgres",
            autocommit=True,
        )
    import MySQLdb

    return MySQLdb.connect(
        host=params["HOST"] or "localhost",
        port=int(params["PORT"] or 3306),
        user=params["USER"],
        password=params["PASSWORD"] or "",
        autocommit=True,
    )


MARIADB_STATUS = [
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_commit",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
]


def server_activity(side: Any) -> dict[str, int]:
    """The server's counters for the idle window (PostgreSQL: of the bench database only)."""
    cursor = side.cursor()
    if vendor() == "postgresql":
        cursor.execute(
            "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, "
            "tup_deleted FROM pg_stat_database WHERE datname = %s",
            [connection.settings_dict["NAME"]],
        )
        names = ["xact_commit", "xact_rollback", "tup_returned", "tup_fetched"]
        names += ["tup_inserted", "tup_updated", "tup_deleted"]
        return dict(zip(names, cursor.fetchone(), strict=True))
    cursor.execute("SHOW GLOBAL STATUS")
    status = {name: value for name, value in cursor.fetchall() if name in MARIADB_STATUS}
    cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
    (others,) = cursor.fetchone()
    return {**{name: int(status[name]) for name in MARIADB_STATUS}, "connections": int(others)}


def mariadb_commits(side: Any) -> int:
    cursor = side.cursor()
    cursor.execute("SHOW GLOBAL STATUS LIKE 'Com_commit'")
    return int(cursor.fetchone()[1])


_SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")


class WalCommits:
    """
    PostgreSQL: commit records in the write-ahead log of transactions that
    wrote to the bench database, from ``start()`` on. The log is read in
    pieces (``read()``), so that it is read before a checkpoint recycles it.
    """

    def __init__(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
            (oid,) = cursor.fetchone()
        self.pattern = f"%/{oid}/%"
        self.lsn = ""
        self.touching: set[str] = set()
        self.committed: dict[str, list[str]] = {}

    def start(self) -> None:
        self.touching.clear()
        self.committed.clear()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
            (self.lsn,) = cursor.fetchone()

    def read(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_flush_lsn() > %s::pg_lsn", [self.lsn])
            if not cursor.fetchone()[0]:
                return
            cursor.execute(
                """
                WITH r AS MATERIALIZED (
                    SELECT end_lsn, xid, record_type, description, block_ref
                    FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn())
                ), x AS (
                    SELECT xid::text AS xid, bool_or(coalesce(block_ref, '') LIKE %s) AS touches,
                           string_agg(CASE WHEN record_type = 'COMMIT' THEN description END, ' ') AS commit
                    FROM r WHERE xid <> '0' GROUP BY xid
                )
                SELECT (SELECT max(end_lsn) FROM r)::text, x.xid, x.touches, x.commit
                FROM (SELECT 1) AS one LEFT JOIN x ON true
                """,
                [self.lsn, self.pattern],
            )
            rows = cursor.fetchall()
        for last, xid, touches, commit in rows:
            if last is not None:
                self.lsn = last
            if xid is None:
                continue
            if touches:
                self.touching.add(xid)
            if commit is not None:
                subxacts = _SUBXACTS.search(commit)
                self.committed[xid] = subxacts.group(1).split() if subxacts else []

    def count(self, exclude: set[str] | frozenset[str] = frozenset()) -> int:
        self.read()
        return sum(
            1
            for xid, subxacts in self.committed.items()
            if xid not in exclude and (xid in self.touching or self.touching.intersection(subxacts))
        )


def current_xid() -> str:
    """PostgreSQL: the id of the transaction in progress (assigning one if it has none)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text")
        return str(cursor.fetchone()[0])


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------


def clear() -> None:
    from django_tasks_db.models import DBTaskResult

    runs = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW)
    WorkflowStepAttempt.objects.filter(step__run__in=runs).delete()
    WorkflowStep.objects.filter(run__in=runs).delete()
    Lease.objects.filter(key__startswith="workflow-run:").delete()
    runs.delete()
    DBTaskResult.objects.all().delete()


def enqueue_later(task: Any, count: int) -> str:
    """``count`` tasks enqueued not yet due; the id of the last one."""
    later = task.using(run_after=timezone.now() + DAY)
    last = ""
    for start in range(0, count, ENQUEUE_BATCH):
        with transaction.atomic():
            for _ in range(min(ENQUEUE_BATCH, count - start)):
                last = later.enqueue().id
    return last


def make_due_pikku() -> set[str]:
    """Every queued task due now, in one commit that wakes the worker; the xid written, if known."""
    with transaction.atomic():
        WorkflowRun.objects.filter(workflow=TASK_WORKFLOW).update(wake_at=Lease.objects.db_now_ms())
        wakeups.work_due(connection.alias)
        return {current_xid()} if vendor() == "postgresql" else set()


def make_due_tdb() -> set[str]:
    from django_tasks_db.models import DBTaskResult

    with transaction.atomic():
        DBTaskResult.objects.update(run_after=timezone.now() - datetime.timedelta(seconds=1))
        return {current_xid()} if vendor() == "postgresql" else set()


def pikku_left(last: str) -> Callable[[], bool]:
    return remaining(
        lambda: WorkflowRun.objects.filter(pk=last, status="running").exists(),
        lambda: WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="running").exists(),
    )


def tdb_left(last: str) -> Callable[[], bool]:
    from django_tasks_db.models import DBTaskResult

    finished = ["SUCCESSFUL", "FAILED"]
    return remaining(
        lambda: DBTaskResult.objects.filter(pk=last).exclude(status__in=finished).exists(),
        lambda: DBTaskResult.objects.exclude(status__in=finished).exists(),
    )


def remaining(last_left: Callable[[], bool], any_left: Callable[[], bool]) -> Callable[[], bool]:
    """
    Is a task left? While the last task enqueued is unfinished, one row read
    by its key; from then on, a look for any unfinished task. Looking for any
    from the start walked the finished rows (and the dead ones no vacuum had
    removed yet) every 20 ms, a load on the server that grew with the
    backlog and slowed the worker measured.
    """
    seen_last = False

    def left() -> bool:
        nonlocal seen_last
        if not seen_last:
            if last_left():
                return True
            seen_last = True
        return any_left()

    return left


def db_clock() -> float:
    """Now on the clock ``running_at`` is written on, in epoch seconds."""
    if vendor() == "sqlite":
        return time.time()
    with connection.cursor() as cursor:
        if vendor() == "postgresql":
            cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
            return float(cursor.fetchone()[0])
        cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))")
        return int(cursor.fetchone()[0]) / 1e6


def epoch(moment: datetime.datetime) -> float:
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def wait_finished(run_id: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not WorkflowRun.objects.filter(pk=run_id, status="completed").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"task {run_id} did not finish within {timeout} s")
        time.sleep(0.005)


# ---------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------


@dataclass
class Drain:
    rate: float
    commits: float
    statements: str
    check: str


def idle(worker: CountedWorker, seconds: float) -> dict[str, Any]:
    side = None if vendor() == "sqlite" else side_connection()
    connection.close()
    server_before = None if side is None else server_activity(side)
    before = worker.snapshot()
    time.sleep(seconds)
    server_after = None if side is None else server_activity(side)
    after = worker.snapshot()
    result: dict[str, Any] = {"worker": delta(before, after)}
    if server_before is not None and server_after is not None:
        result["server"] = delta(server_before, server_after)
        result["connections"] = server_after.get("connections")
        side.close()
    return result


def wakeup_latencies(samples: int) -> list[float]:
    rng = random.Random(14)
    latencies = []
    for _ in range(samples):
        time.sleep(0.2 + rng.random())
        # In one transaction: in autocommit the run's row commits (and on
        # PostgreSQL wakes the worker) before enqueue() inserts the task's
        # step, and a worker that inserts the step first makes that INSERT
        # fail on the step's unique key (bench/README.md, issue 14 measurements).
        with transaction.atomic():
            result = noop.enqueue()
        committed = db_clock()
        wait_finished(result.id)
        attempt = WorkflowStepAttempt.objects.get(step__run_id=result.id)
        latencies.append(epoch(attempt.running_at) - committed)
    return latencies


def lone_commits(
    worker: CountedWorker, tasks: int, wal: WalCommits | None
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Durable commits of ``tasks`` lone tasks, one by one; and the worker's commits by tables written."""
    counts: dict[str, list[int]] = {"worker": [], "server": []}
    by: dict[str, int] = {}
    side = side_connection() if vendor() == "mysql" else None
    for _ in range(tasks):
        time.sleep(1.0)
        if wal is not None:
            wal.start()
        handler = None if side is None else mariadb_commits(side)
        before = worker.snapshot()
        with transaction.atomic():
            result = noop.enqueue()
            enqueue_xid = {current_xid()} if wal is not None else set()
        wait_finished(result.id)
        time.sleep(0.2)
        seen = delta(before, worker.snapshot())
        counts["worker"].append(seen["commit"])
        for key, n in seen["commits_by"].items():
            by[key] = by.get(key, 0) + n
        if wal is not None:
            counts["server"].append(wal.count(exclude=enqueue_xid))
        if side is not None and handler is not None:
            # Less the enqueue's own COMMIT (its two INSERTs in one transaction).
            counts["server"].append(mariadb_commits(side) - handler - 1)
    if side is not None:
        side.close()
    return counts, by


def drain(
    worker: CountedWorker, count: int, make_due: Any, left: Any, wal: WalCommits | None
) -> tuple[float, dict[str, int], int | None, int | None]:
    """Make ``count`` queued tasks due and time them through ``worker``: seconds, counts, server commits."""
    side = side_connection() if vendor() == "mysql" else None
    if wal is not None:
        wal.start()
    before = worker.snapshot()
    handler = None if side is None else mariadb_commits(side)
    started = time.perf_counter()
    excluded = make_due()
    last_read = time.monotonic()
    while left():
        if time.perf_counter() - started > 1200:
            raise SystemExit("the tasks did not finish within 20 minutes")
        time.sleep(0.02)
        if wal is not None and time.monotonic() - last_read > 2:
            wal.read()
            last_read = time.monotonic()
    seconds = time.perf_counter() - started
    counts = delta(before, worker.snapshot())
    server = None
    if wal is not None:
        server = wal.count(exclude=excluded)
    handler_delta = None
    if side is not None and handler is not None:
        handler_delta = mariadb_commits(side) - handler - 1
        side.close()
    return seconds, counts, server, handler_delta


def per_task(counts: dict[str, int], count: int) -> str:
    kinds = ("select", "write", "unchanged", "probe", "begin", "other", "commit")
    return ", ".join(f"{counts[k] / count:.2f} {k}" for k in kinds if counts.get(k))


def waits(count: int) -> tuple[float, float]:
    """``count`` 50 ms tasks through a 16-lane worker: (wall tasks/s, drain tasks/s)."""
    clear()
    left = pikku_left(enqueue_later(sleep_50ms, count))
    proc = start_worker(MODULE, [*PIKKU, "--concurrency", "16"])
    try:
        time.sleep(2)
        started = time.perf_counter()
        make_due_pikku()
        while left():
            time.sleep(0.01)
        wall = time.perf_counter() - started
    finally:
        stop_worker(proc)
    attempts = WorkflowStepAttempt.objects.filter(step__run__workflow=TASK_WORKFLOW, status="succeeded")
    span = attempts.aggregate(first=Min("running_at"), last=Max("succeeded_at"))
    done = attempts.count()
    clear()
    if done != count:
        raise SystemExit(f"{done}/{count} waiting tasks succeeded")
    return count / wall, count / (epoch(span["last"]) - epoch(span["first"]))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=positive_int, default=10_000, help="no-op tasks (default 10,000)")
    parser.add_argument("--waits", type=positive_int, default=200, help="50 ms tasks (default 200)")
    parser.add_argument("--wakeups", type=positive_int, default=40, help="enqueues timed (default 40)")
    parser.add_argument("--lone", type=positive_int, default=5, help="lone tasks counted (default 5)")
    parser.add_argument("--idle", type=float, default=10.0, help="idle window, seconds (default 10)")
    parser.add_argument(
        "--only",
        choices=["all", "wakeups"],
        default="all",
        help="'wakeups': figures 4 and 3 alone (the idle worker and its wake-ups); default %(default)r",
    )
    options = parser.parse_args()
    migrated = migrate_if_needed()
    if WorkflowRun.objects.filter(status="running").exclude(workflow=TASK_WORKFLOW).exists():
        raise SystemExit("runs are running in this database: point the bench at a scratch database")
    wal = None
    if vendor() == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        wal = WalCommits()
    for line in environment([f"migrated: {migrated}", f"no-op tasks: {options.tasks}"]):
        print(line, flush=True)
    clear()

    worker = CountedWorker(PIKKU)
    try:
        time.sleep(3)
        quiet = idle(worker, options.idle)
        print(f"idle {options.idle:.0f} s, in the worker: {quiet['worker']}", flush=True)
        if "server" in quiet:
            print(f"idle {options.idle:.0f} s, on the server: {quiet['server']}", flush=True)
        latencies = wakeup_latencies(options.wakeups)
        print("wake-up latencies, ms: " + " ".join(f"{x * 1000:.1f}" for x in latencies), flush=True)
        if options.only == "wakeups":
            report_wakeups(options, quiet, latencies)
            return
        lone, lone_by = lone_commits(worker, options.lone, wal)
        print(f"lone task commits: {lone}", flush=True)
        print(f"lone tasks' commits in the worker, by tables written: {lone_by}", flush=True)
        clear()
        left = pikku_left(enqueue_later(noop, options.tasks))
        seconds, counts, wal_commits, handler = drain(worker, options.tasks, make_due_pikku, left, wal)
    finally:
        worker.stop()
    completed = WorkflowRun.objects.filter(workflow=TASK_WORKFLOW, status="completed").count()
    pikku = Drain(
        options.tasks / seconds,
        counts["commit"] / options.tasks,
        per_task(counts, options.tasks),
        f"{completed}/{options.tasks} completed",
    )
    server_pikku = wal_commits if wal_commits is not None else handler
    print(f"pikku_worker commits at saturation, by tables written: {counts['commits_by']}")
    print(f"pikku_worker writes that changed no row: {counts['unchanged_by']}")
    print(
        f"pikku_worker: {pikku.rate:.1f} tasks/s ({pikku.check}); per task: {pikku.statements}; "
        f"server commits {server_pikku}",
        flush=True,
    )

    clear()
    left = tdb_left(enqueue_later(noop_tdb, options.tasks))
    worker = CountedWorker(TDB)
    try:
        time.sleep(2)
        seconds, counts, wal_commits, handler = drain(worker, options.tasks, make_due_tdb, left, wal)
    finally:
        worker.stop()
    from django_tasks_db.models import DBTaskResult

    done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    tdb = Drain(
        options.tasks / seconds,
        counts["commit"] / options.tasks,
        per_task(counts, options.tasks),
        f"{done}/{options.tasks} SUCCESSFUL",
    )
    server_tdb = wal_commits if wal_commits is not None else handler
    print(f"db_worker commits, by tables written: {counts['commits_by']}")
    print(
        f"db_worker: {tdb.rate:.1f} tasks/s ({tdb.check}); per task: {tdb.statements}; "
        f"server commits {server_tdb}",
        flush=True,
    )
    clear()

    wall, drained = waits(options.waits)
    print(f"50 ms tasks, 16 lanes: wall {wall:.1f}/s, drain {drained:.1f}/s", flush=True)
    report(options, quiet, latencies, lone, pikku, tdb, server_pikku, server_tdb, wall, drained)


def report_wakeups(options: argparse.Namespace, quiet: dict[str, Any], latencies: list[float]) -> None:
    """Figures 3 and 4 alone (``--only wakeups``)."""
    idle_worker = quiet["worker"]
    ms = [x * 1000 for x in latencies]
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    print(
        f"| 3. enqueue commit -> start, idle worker (n={len(ms)}) | p50 {percentile(ms, 0.5):.1f} ms, "
        f"p99 {percentile(ms, 0.99):.1f} ms | PG p50 <= 5, p99 <= 25; others p50 <= 60 |"
    )
    print(
        f"| 4. idle worker, in the worker | {idle_worker['select'] / options.idle:.1f} SELECT/s, "
        f"{idle_worker['write']} writes, {idle_worker['commit']} commits in {options.idle:.0f} s "
        "| <= 10 reads/s, no writes |"
    )


def report(
    options: argparse.Namespace,
    quiet: dict[str, Any],
    latencies: list[float],
    lone: dict[str, list[int]],
    pikku: Drain,
    tdb: Drain,
    server_pikku: int | None,
    server_tdb: int | None,
    wall: float,
    drained: float,
) -> None:
    n = options.tasks
    where = {"postgresql": "WAL commit records", "mysql": "Com_commit, server-wide", "sqlite": "-"}[vendor()]
    idle_worker = quiet["worker"]
    reads = idle_worker["select"] / options.idle
    writes = idle_worker["write"]
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    print()
    print("| figure (issue 14) | measured | target |")
    print("|---|---|---|")
    print(f"| 1. {n} no-op tasks, pikku_worker defaults | {pikku.rate:.1f}/s | |")
    print(f"| 1. the same through db_worker defaults | {tdb.rate:.1f}/s | |")
    print(f"| 1. pikku / db_worker | {pikku.rate / tdb.rate:.2f}x | PG >= 3x, MariaDB and SQLite >= 2x |")
    print(
        f"| 2. {options.waits} tasks of 50 ms, --concurrency 16, wall | {wall:.1f}/s = "
        f"{wall / IDEAL_WAITS_PER_S:.2f} of 320/s | >= 0.7 |"
    )
    print(f"| 2. the same, first start to last end | {drained:.1f}/s = {drained / IDEAL_WAITS_PER_S:.2f} | |")
    ms = [x * 1000 for x in latencies]
    print(
        f"| 3. enqueue commit -> start, idle worker (n={len(ms)}) | p50 {percentile(ms, 0.5):.1f} ms, "
        f"p99 {percentile(ms, 0.99):.1f} ms | PG p50 <= 5, p99 <= 25; others p50 <= 60 |"
    )
    print(
        f"| 4. idle worker, in the worker | {reads:.1f} SELECT/s, {writes} writes, "
        f"{idle_worker['commit']} commits in {options.idle:.0f} s | <= 10 reads/s, no writes |"
    )
    if "server" in quiet:
        server = quiet["server"]
        if vendor() == "postgresql":
            rows = server["tup_inserted"] + server["tup_updated"] + server["tup_deleted"]
            print(
                f"| 4. idle worker, pg_stat_database | {server['xact_commit'] / options.idle:.1f} "
                f"transactions/s, {server['tup_returned'] / options.idle:.0f} rows returned/s, "
                f"{rows} rows written in {options.idle:.0f} s | |"
            )
        else:
            rows = server["Handler_write"] + server["Handler_update"]
            rows += server["Handler_delete"]
            print(
                f"| 4. idle worker, SHOW GLOBAL STATUS (server-wide; {quiet['connections']} connections "
                f"besides the bench's, the worker's included) | "
                f"{server['Com_select'] / options.idle:.1f} Com_select/s, "
                f"{rows} rows written (Handler_write/update/delete), {server['Com_commit']} Com_commit | |"
            )
    print(
        f"| 5. durable commits, lone task, in the worker | median {statistics.median(lone['worker'])} "
        f"({lone['worker']}) | <= 3 |"
    )
    if lone["server"]:
        print(f"| 5. the same, {where} | median {statistics.median(lone['server'])} ({lone['server']}) | |")
    print(f"| 5. durable commits per task at saturation, in the worker | {pikku.commits:.2f} | <= 1 |")
    if server_pikku is not None:
        print(f"| 5. the same, {where} | {server_pikku / n:.2f} | |")
    print(f"| 5. db_worker commits per task at saturation, in the worker | {tdb.commits:.2f} | |")
    if server_tdb is not None:
        print(f"| 5. the same, {where} | {server_tdb / n:.2f} | |")
    print(f"\nper task, in the worker: pikku_worker {pikku.statements}; db_worker {tdb.statements}")
    print(f"checks: pikku {pikku.check}; db_worker {tdb.check}")


if __name__ == "__main__":
    main()
