"""
Retention: the sweep deletes finished runs past PIKKU_RETENTION_MS (judged by
updated_at on the database clock) with their steps, attempts and signals,
oldest first and at most --prune-limit per pass, never a run whose parent or
child is unfinished.
"""

from __future__ import annotations

import io
import json
from unittest import skipUnless

from django.core.management import call_command
from django.db import connection
from django.test import SimpleTestCase, TestCase, TransactionTestCase, override_settings

from pikku_django.checks import RETENTION_CHECK_ID, check_retention
from pikku_django.conf import RETENTION_DEFAULTS, conf
from pikku_django.models import WorkflowRun, WorkflowSignal, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import prune_runs, sweep
from pikku_django.workflows import retry_workflow, run_workflow, send_signal, start_workflow
from tests.support.factories import age

DAY_MS = 24 * 3600 * 1000


def finished(workflow: str = "test.double", input: object = 2, **kwargs: object) -> WorkflowRun:
    run = start_workflow(workflow, input, inline=True, **kwargs)  # type: ignore[arg-type]
    assert run.is_finished, run.status
    return run


def aged(run: WorkflowRun, ms: int) -> WorkflowRun:
    age(WorkflowRun, run.pk, ms)
    return run


def kept() -> set[object]:
    return set(WorkflowRun.objects.values_list("pk", flat=True))


class RetentionTests(TransactionTestCase):
    def test_runs_past_their_status_retention_are_deleted_with_their_rows(self) -> None:
        old = aged(finished(), 7 * DAY_MS + 60_000)
        young = aged(finished(), 7 * DAY_MS - 60_000)
        failed = aged(finished("test.fails", None), 29 * DAY_MS)
        older_failed = aged(finished("test.fails", None), 31 * DAY_MS)
        running = aged(start_workflow("test.double", 3), 365 * DAY_MS)
        assert sweep().pruned_runs == 2
        assert kept() == {young.pk, failed.pk, running.pk}
        assert not WorkflowStep.objects.filter(run_id__in=[old.pk, older_failed.pk]).exists()
        assert not WorkflowStepAttempt.objects.filter(step__run_id__in=[old.pk]).exists()
        assert WorkflowStep.objects.filter(run=young).exists()

    def test_signals_go_with_their_run(self) -> None:
        run = start_workflow("test.signals", {"name": "go", "waits": 1})
        run_workflow(run.pk)
        send_signal(run.pk, "go", 1)
        send_signal(run.pk, "go", 2)  # never consumed
        assert run_workflow(run.pk).status == "completed"
        aged(run, 8 * DAY_MS)
        assert prune_runs() == 1
        assert not WorkflowSignal.objects.exists()
        assert not WorkflowStepAttempt.objects.exists()

    def test_none_keeps_for_ever_and_a_missing_status_keeps_its_default(self) -> None:
        completed = aged(finished(), 365 * DAY_MS)
        failed = aged(finished("test.fails", None), 31 * DAY_MS)
        cancelled = start_workflow("test.sleeper", {"ms": 60_000})
        cancelled.steps.all().delete()
        WorkflowRun.objects.filter(pk=cancelled.pk).update(status="cancelled")
        aged(cancelled, 2_000)
        with override_settings(PIKKU_RETENTION_MS={"completed": None, "cancelled": 1_000}):
            assert conf.RETENTION_MS["failed"] == RETENTION_DEFAULTS["failed"]
            assert prune_runs() == 2
        assert kept() == {completed.pk}
        assert failed.pk not in kept()

    def test_oldest_first_at_most_the_limit_per_pass(self) -> None:
        runs = [aged(finished(), (10 + i) * DAY_MS) for i in range(5)]
        failed = aged(finished("test.fails", None), 40 * DAY_MS)
        assert prune_runs(2) == 2
        assert kept() == {r.pk for r in runs[:4]}  # the failed run (40 days) was the oldest
        assert sweep(prune_limit=2).pruned_runs == 2
        assert kept() == {r.pk for r in runs[:2]}
        assert prune_runs(1) == 1 and kept() == {runs[0].pk}
        assert prune_runs(2) == 1 and prune_runs(2) == 0
        assert failed.pk not in kept()

    def test_never_a_run_whose_parent_or_child_is_unfinished(self) -> None:
        parent = start_workflow("test.parent", {"child": "test.double", "child_input": 2})
        run_workflow(parent.pk)
        (child,) = WorkflowRun.objects.filter(parent=parent)
        assert run_workflow(child.pk).status == "completed"
        WorkflowRun.objects.filter(pk=parent.pk).update(status="running")
        aged(child, 30 * DAY_MS)
        assert prune_runs() == 0
        # The other way round: a finished parent with an unfinished child.
        WorkflowRun.objects.filter(pk=parent.pk).update(status="completed")
        WorkflowRun.objects.filter(pk=child.pk).update(status="running")
        aged(parent, 30 * DAY_MS)
        assert prune_runs() == 0
        assert kept() == {parent.pk, child.pk}
        # Both finished: the parent goes, and its child with it.
        WorkflowRun.objects.filter(pk=child.pk).update(status="completed")
        aged(child, 30 * DAY_MS)
        assert prune_runs() == 2
        assert kept() == set()

    def test_a_pruned_idempotency_key_starts_a_new_run(self) -> None:
        first = finished(idempotency_key="order-7")
        assert start_workflow("test.double", 2, idempotency_key="order-7").pk == first.pk
        aged(first, 8 * DAY_MS)
        assert prune_runs() == 1
        second = start_workflow("test.double", 2, idempotency_key="order-7")
        assert second.pk != first.pk and second.status == "running"

    def test_a_retried_run_is_no_longer_pruned(self) -> None:
        run = aged(finished("test.fails", None), 31 * DAY_MS)
        assert prune_runs(dry_run=True) == 1
        assert retry_workflow(run.pk) is True
        assert prune_runs() == 0 and kept() == {run.pk}

    def test_dry_run_and_the_command(self) -> None:
        aged(finished(), 8 * DAY_MS)
        assert sweep(dry_run=True).pruned_runs == 1
        out = io.StringIO()
        call_command("pikku_sweep", "--json", "--dry-run", "--prune-limit", "5", stdout=out)
        assert json.loads(out.getvalue())["pruned_runs"] == 1
        out = io.StringIO()
        call_command("pikku_sweep", stdout=out)
        assert "and 1 finished runs" in out.getvalue()
        assert kept() == set()


@skipUnless(connection.vendor == "postgresql", "EXPLAIN output is PostgreSQL's")
class RetentionPlanTests(TestCase):
    def test_the_prune_walks_use_the_status_updated_index(self) -> None:
        for _ in range(3):
            finished()
        captured: list[tuple[str, object]] = []

        def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
            captured.append((text, params))
            return execute(text, params, many, context)

        with connection.execute_wrapper(capture):
            prune_runs(dry_run=True)
        assert len(captured) == 3
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            for text, params in captured:
                cursor.execute("EXPLAIN " + text, params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                assert "pikku_run_status_upd_idx" in plan, plan
                assert "Sort  (" not in plan, plan


class RetentionCheckTests(SimpleTestCase):
    def test_the_setting_is_checked(self) -> None:
        assert check_retention() == []
        with override_settings(PIKKU_RETENTION_MS={"completed": 1_000, "failed": None}):
            assert check_retention() == []
        for bad in ([1], {"done": 1}, {"failed": 0}, {"failed": "7d"}, {"failed": True}):
            with override_settings(PIKKU_RETENTION_MS=bad):
                errors = check_retention()
            assert [e.id for e in errors] == [RETENTION_CHECK_ID], bad
            assert "PIKKU_RETENTION_MS" in errors[0].msg and errors[0].hint
