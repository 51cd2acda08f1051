"""
A backlog loaded fast, in one INSERT ... SELECT per kind: runs asleep until
later (future ``wake_at``) and queued tasks (running, due, not yet taken, no
step), for the query-plan tests and ``bench/backlog.py``.
"""

from __future__ import annotations

import datetime

from django.db import connection

from pikku_django.models import Lease, WorkflowRun, WorkflowStep

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
WORKFLOW = "backlog"

#: The ids are sequential under a prefix of their own: one per kind.
FUTURE_PREFIX = "b4c10000"
QUEUED_PREFIX = "b4c20000"
CHILD_PREFIX = "b4c30000"
MIXED_PREFIX = "b4c40000"
MORE_PREFIX = "b4c50000"


def _numbers(count: int) -> str:
    """A FROM clause of the integers 0 .. count - 1 as ``n.i``, per vendor."""
    if connection.vendor == "postgresql":
        return f"generate_series(0, {count - 1}) AS n(i)"
    if connection.vendor == "mysql":
        # MariaDB's SEQUENCE engine (a recursive CTE stops at max_recursive_iterations).
        return f"(SELECT seq AS i FROM seq_0_to_{count - 1}) AS n"
    series = f"WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {count - 1})"
    return f"({series} SELECT i FROM s) AS n"


def _uuid(prefix: str) -> str:
    """An id for row ``n.i``, in the column's own form."""
    if connection.vendor == "postgresql":
        return f"('{prefix}-0000-4000-8000-' || lpad(to_hex(n.i), 12, '0'))::uuid"
    if connection.vendor == "mysql":
        return f"CONCAT('{prefix}-0000-4000-8000-', LPAD(HEX(n.i), 12, '0'))"
    return f"'{prefix}00004000' || '8000' || printf('%012x', n.i)"


def load(future: int, queued: int, *, priority: int = 0) -> int:
    """
    Insert ``future`` runs asleep until tomorrow (at ``priority``) and
    ``queued`` due tasks, all running and untouched for an hour (older than
    the sweep's stalled and undispatched windows), then ANALYZE the table so
    the planner knows them. Returns the database clock's now (epoch ms).
    """
    now = Lease.objects.db_now_ms()
    stamp = connection.ops.adapt_datetimefield_value(
        datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    )
    table = WorkflowRun._meta.db_table
    columns = "id, workflow, status, wake_at, queue, priority, sweep_wakes, created_at, updated_at"
    with connection.cursor() as cursor:
        for count, prefix, wake_at, prio in (
            (future, FUTURE_PREFIX, f"{now + DAY_MS} + n.i", priority),
            (queued, QUEUED_PREFIX, f"{now - HOUR_MS} + n.i", 0),
        ):
            if count:
                cursor.execute(
                    f"INSERT INTO {table} ({columns}) SELECT {_uuid(prefix)}, %s, 'running', {wake_at}, "  # noqa: S608
                    f"'default', {prio}, 0, %s, %s FROM {_numbers(count)}",
                    [WORKFLOW, stamp, stamp],
                )
    analyze()
    return now


def load_mixed(count: int, *, workflow: str = WORKFLOW, prefix: str = MIXED_PREFIX) -> int:
    """
    ``count`` runs as a kept history looks (one INSERT ... SELECT, no ANALYZE):
    a quarter each running and due, suspended, completed and failed, over
    three queues and fifty keys, their ids under ``prefix``. Returns how many.
    """
    table = WorkflowRun._meta.db_table
    key_column = connection.ops.quote_name("key")
    columns = (
        f"id, workflow, status, wake_at, queue, {key_column}, priority, sweep_wakes, created_at, updated_at"
    )
    stamp = connection.ops.adapt_datetimefield_value(
        datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    )
    key = "CONCAT('k', n.i %% 50)" if connection.vendor == "mysql" else "'k' || (n.i %% 50)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {_uuid(prefix)}, %s, "  # noqa: S608
            "CASE n.i %% 4 WHEN 0 THEN 'running' WHEN 1 THEN 'suspended' WHEN 2 THEN 'completed' "
            "ELSE 'failed' END, CASE n.i %% 4 WHEN 0 THEN n.i ELSE NULL END, "
            f"CASE n.i %% 3 WHEN 0 THEN 'default' WHEN 1 THEN 'emails' ELSE 'reports' END, {key}, "
            f"0, 0, %s, %s FROM {_numbers(count)}",
            [workflow, stamp, stamp],
        )
        return cursor.rowcount


def load_children(count: int) -> int:
    """
    ``count`` running children of the backlog's runs asleep until later (one
    INSERT ... SELECT), then ANALYZE. Returns how many.
    """
    if count <= 0:
        return 0
    table = WorkflowRun._meta.db_table
    columns = "id, workflow, status, wake_at, queue, priority, sweep_wakes, parent_id, created_at, updated_at"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {_uuid(CHILD_PREFIX)}, r.workflow, 'running', "  # noqa: S608
            f"r.wake_at, r.queue, r.priority, 0, r.id, r.created_at, r.updated_at FROM {_numbers(count)} "
            f"JOIN {table} r ON r.id = {_uuid(FUTURE_PREFIX)}"
        )
        inserted = cursor.rowcount
    analyze()
    return inserted


def load_pending_steps() -> int:
    """
    A pending step for each queued task of the backlog, as ``enqueue`` stores
    it with its run (one INSERT ... SELECT), then ANALYZE. Returns how many.
    """
    if connection.vendor == "postgresql":
        step_id = "gen_random_uuid()"
    elif connection.vendor == "mysql":
        step_id = "UUID()"
    else:
        step_id = "lower(hex(randomblob(16)))"
    runs, steps = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
    columns = (
        "id, run_id, step_name, rpc_name, status, retries, worker_losses, attempt, budget_base, losses, "
        "provisional, created_at, updated_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {steps} ({columns}) SELECT {step_id}, r.id, 'task', 'backlog.task', "  # noqa: S608
            "'pending', 0, 2, 1, 0, 0, %s, r.created_at, r.updated_at "
            f"FROM {runs} r WHERE r.workflow = %s AND r.wake_at <= %s",
            [False, WORKFLOW, Lease.objects.db_now_ms()],
        )
        inserted = cursor.rowcount
    analyze()
    return inserted


def analyze() -> None:
    """Fresh planner statistics for the run and step tables."""
    with connection.cursor() as cursor:
        for table in ("pikku_workflow_run", "pikku_workflow_step"):
            cursor.execute(f"ANALYZE TABLE {table}" if connection.vendor == "mysql" else f"ANALYZE {table}")
            if connection.vendor == "mysql":
                cursor.fetchall()


def clear() -> None:
    """Delete the backlog's runs in one DELETE each for their steps and them (nothing else points at them)."""
    WorkflowStep.objects.filter(run__workflow=WORKFLOW)._raw_delete(connection.alias)
    WorkflowRun.objects.filter(workflow=WORKFLOW)._raw_delete(connection.alias)
