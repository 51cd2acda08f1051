"""The hot queries use their indexes (PostgreSQL's planner, asked with EXPLAIN)."""

from __future__ import annotations

from typing import Any
from unittest import skipUnless

import pytest
from django.db import connection
from django.test import TestCase, TransactionTestCase

from pikku_django import sql
from pikku_django.managers import now_params
from pikku_django.models import WorkflowRun
from pikku_django.sweep import sweep
from pikku_django.worker import Worker
from tests.support import backlog_rows
from tests.support.factories import make_run, make_step
from tests.support.plans import capture_selects, examined, plan_text

# The plans depend on the planner's statistics, and BacklogTests leave those of
# 200,000 rows behind (and, on MariaDB, their index entries until purged):
# under xdist the module runs on one worker, in its own order, as it would alone.
pytestmark = pytest.mark.xdist_group("query_plans")


def explain(text: str, params: object) -> str:
    with connection.cursor() as cursor:
        # Tiny test tables would be scanned whole; ask whether the index *can* serve.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + text, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@skipUnless(connection.vendor == "postgresql", "EXPLAIN output is PostgreSQL's")
class QueryPlanTests(TestCase):
    def setUp(self) -> None:
        for _ in range(5):
            make_step(make_run())

    def test_claim_uses_the_run_step_name_index(self) -> None:
        step = make_step()
        params = {
            "run_id": step.run_id,
            "step_name": step.step_name,
            "rpc_name": step.rpc_name,
            "lease_ms": 1000,
            "holder": "w1",
            "by_take": False,
            "provisional": False,
            **now_params(connection),
        }
        plan = explain(sql.statement("step_claim", connection), params)
        assert "pikku_step_run_name_uniq" in plan, plan
        assert "Seq Scan on pikku_workflow_step" not in plan, plan

    def test_stalled_uses_the_run_and_step_indexes(self) -> None:
        captured: list[tuple[str, object]] = []

        def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
            captured.append((text, params))
            return execute(text, params, many, context)

        with connection.execute_wrapper(capture):
            WorkflowRun.objects.stalled(60_000)
        ((text, params),) = captured
        plan = explain(text, params)
        assert "pikku_run_status_upd_idx" in plan, plan
        assert "Index Cond: (((status)::text = 'running'::text) AND (updated_at <=" in plan, plan
        # Three probes of a run's steps, each through an index: one in
        # flight, one touched lately (both by the run), one under a lapsed
        # lease (a run due later with one lost its worker, so it is stalled
        # after all; by the run, or by status and lease, as the table's
        # statistics make it cheaper).
        assert plan.count("Index Scan using pikku_step_run_name_uniq") >= 2, plan
        probes = plan.count("Index Scan using pikku_step_run_name_uniq") + plan.count(
            "Index Scan using pikku_step_status_lease_idx"
        )
        assert probes == 3, plan
        assert "Seq Scan" not in plan, plan

    def test_due_query_walks_the_priority_index_in_its_order(self) -> None:
        for worker in [Worker(holder="w"), Worker(holder="w", queues=["a", "b"])]:
            captured: list[tuple[str, object]] = []

            def capture(execute, text, params, many, context, captured=captured):  # type: ignore[no-untyped-def]
                captured.append((text, params))
                return execute(text, params, many, context)

            with connection.execute_wrapper(capture):
                worker.due(exclude={"full"})
            ((text, params),) = captured
            with connection.cursor() as cursor:
                # Can the index give the order by itself? With sorting priced
                # out, a plan that needs one still shows a Sort node.
                cursor.execute("SET LOCAL enable_sort = off")
                cursor.execute("SET LOCAL enable_bitmapscan = off")
            plan = explain(text, params)
            # One walk per active status, bounded by its status and the clock
            # and read in the index's order (priority DESC, wake_at) ...
            assert plan.count("Index Scan using pikku_run_due_idx") == 2, plan
            assert plan.count("Index Cond: (((status)::text = 'running'::text) AND (wake_at <=") == 1, plan
            assert plan.count("Index Cond: (((status)::text = 'suspended'::text) AND (wake_at <=") == 1, plan
            # ... so nothing sorts the due runs: the two walks are merged in order.
            assert "Merge Append" in plan, plan
            assert "Sort  (" not in plan, plan
            # The paused queues are read whole: a row per queue (``unpaused``).
            assert "Seq Scan" not in plan.replace("Seq Scan on pikku_workflow_queue", ""), plan


class BacklogTests(TransactionTestCase):
    """
    An idle worker's look and a sweep pass read as much with 200,000 runs
    asleep until later and 200,000 queued tasks (50,000 each on SQLite, whose
    reads are counted exactly) as on an empty table: each
    statement's reads (``examined``) do not grow, and its plan reads an
    index range, not a walk that filters (issue 19). The rows are committed
    and ANALYZEd, as a live table's are (on MariaDB, ANALYZE TABLE commits).
    """

    SIZE = 50_000 if connection.vendor == "sqlite" else 200_000

    def looks(self) -> list[tuple[str, Any]]:
        return capture_selects(Worker(holder="plans").due)

    def sweeps(self) -> list[tuple[str, Any]]:
        return capture_selects(sweep)

    def assert_flat(self, empty: list[tuple[str, Any]], loaded: list[tuple[str, Any]]) -> None:
        assert [text for text, _ in empty] == [text for text, _ in loaded]
        for (text, params), (_, loaded_params) in zip(empty, loaded, strict=True):
            before, after = examined(text, params), examined(text, loaded_params)
            # Room for an index a level or two deeper (a few pages, rows or
            # steps for each index read), never for a walk of the backlog.
            slack = 500 if connection.vendor == "sqlite" else 60
            assert after <= 2 * before + slack, (before, after, text, plan_text(text, loaded_params))

    def test_an_idle_look_and_a_sweep_pass_read_no_more_with_a_backlog(self) -> None:
        backlog_rows.analyze()
        empty_look, empty_sweep = self.looks(), self.sweeps()
        backlog_rows.load(self.SIZE, 0)
        look = self.looks()
        assert WorkflowRun.objects.due().count() == 0
        self.assert_flat(empty_look, look)
        self.assert_look_plan(*look[0])
        backlog_rows.load(0, self.SIZE)
        passes = self.sweeps()
        self.assert_flat(empty_sweep, passes)
        for text, params in passes:
            self.assert_sweep_plan(text, plan_text(text, params))
        # The queued tasks are due, and a look finds them, earliest first.
        due = [pk for pk, _, _ in WorkflowRun.objects.get_queryset().next_due(10)]
        assert [str(pk)[-4:] for pk in due] == [f"{n:04x}" for n in range(10)], due
        assert all(str(pk).startswith(backlog_rows.QUEUED_PREFIX) for pk in due), due

    def test_the_look_reads_no_more_with_a_backlog_of_due_tasks(self) -> None:
        # A lane's look while a backlog drains reads the first few due runs in
        # the order of pikku_run_due_idx, not every due run sorted. (Named to
        # run after the test above: on MariaDB the 200,000 rows this one
        # deletes linger in the indexes until purged, and the plan that test
        # asks for depends on the optimizer's estimates of them.)
        backlog_rows.load(0, 20)
        few = [examined(text, params) for text, params in self.looks()]
        backlog_rows.clear()
        backlog_rows.load(0, self.SIZE)
        if connection.vendor == "sqlite":
            # As a project's SQLite file is: never ANALYZEd (Django does not),
            # so the planner guesses; with statistics it finds the index itself.
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM sqlite_stat1")
                cursor.execute("ANALYZE sqlite_schema")
        looks = self.looks()
        many = [examined(text, params) for text, params in looks]
        slack = 500 if connection.vendor == "sqlite" else 60
        for before, after, (text, params) in zip(few, many, looks, strict=True):
            assert after <= 2 * before + slack, (before, after, plan_text(text, params))
        assert len(Worker(holder="plans").due()) == 10

    def assert_look_plan(self, text: str, params: Any) -> None:
        plan = plan_text(text, params)
        # The walk's status key is the earliest due run's status, read once
        # from a range of the (status, wake_at) index: with nothing due, NULL.
        if connection.vendor == "postgresql":
            assert plan.count("Index Cond: (((status)::text = ($") == 2, plan
            assert "Index Only Scan using pikku_run_status_wake_idx" in plan, plan
        elif connection.vendor == "mysql":
            # Read while planning: with nothing due there is nothing to walk.
            assert plan.count("Impossible WHERE") == 2, plan
        else:
            range_read = "USING COVERING INDEX pikku_run_status_wake_idx (status=? AND wake_at<?)"
            assert plan.count(range_read) == 2, plan
        runs_plan = plan.replace("Seq Scan on pikku_workflow_queue", "")
        assert "Seq Scan" not in runs_plan and "SCAN pikku_workflow_run" not in plan, plan

    def assert_sweep_plan(self, text: str, plan: str) -> None:
        head, _, where = text.replace("`", '"').partition(" WHERE ")
        stalled = 'FROM "pikku_workflow_run"' in head and "BETWEEN" in where and "updated_at" in where
        if stalled:
            # Read from the ranges of runs woken out of turn or with no wake_at, not the backlog.
            assert "pikku_run_status_wake_idx" in plan, plan
            assert "pikku_run_status_upd_idx" not in plan, plan
        assert "Seq Scan on pikku_workflow_run" not in plan, plan
        assert "SCAN pikku_workflow_run" not in plan.replace("SCAN pikku_workflow_run USING", ""), plan
