"""The hot queries use their indexes (PostgreSQL's planner, asked with EXPLAIN)."""

from __future__ import annotations

from unittest import skipUnless

from django.db import connection
from django.test import TestCase

from pikku_django import sql
from pikku_django.managers import now_params
from pikku_django.models import WorkflowRun
from tests.conftest import make_run, make_step


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
        # Three probes of a run's steps, each by the run: one in flight, one
        # touched lately, one under a lapsed lease (a run due later with one
        # lost its worker, so it is stalled after all).
        assert plan.count("Index Scan using pikku_step_run_name_uniq") == 3, plan
        assert "Seq Scan" not in plan, plan

    def test_due_query_walks_the_priority_index_in_its_order(self) -> None:
        from pikku_django.worker import Worker

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
            assert "Seq Scan" not in plan, plan
