"""
The retention prune with a backlog of unfinished runs (some of them
children): each of its statements is an index range or probe, on SQLite as
on PostgreSQL and MariaDB, whatever the planner's statistics (issue 30): no
statement scans the runs, and none reads more with the backlog than without.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun
from pikku_django.sweep import prune_runs
from tests.support import backlog_rows
from tests.support.factories import age, make_run
from tests.support.plans import capture_selects, examined, plan_text
from tests.sweep.test_sweep_plans import full_scans

# Planner statistics are per table: run apart from the other plan tests.
pytestmark = pytest.mark.xdist_group("query_plans")

SIZE = 4_000
EXPIRED = 20
CHILDREN = 20
DAY_MS = 86_400_000


def expired_runs() -> set[Any]:
    """``EXPIRED`` completed runs past their retention, every other one with a completed child."""
    made: set[Any] = set()
    for i in range(EXPIRED):
        run = make_run("test.double")
        made.add(run.pk)
        if i % 2:
            made.add(make_run("test.double", parent=run).pk)
    WorkflowRun.objects.filter(pk__in=made).update(status="completed")
    for pk in made:
        age(WorkflowRun, pk, 40 * DAY_MS)
    return made


def plans_of(call: Any) -> list[tuple[str, str]]:
    """Each SELECT of the runs ``call()`` sends, with its plan read just before it runs."""
    seen: list[tuple[str, str]] = []

    def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
        reads = text.lstrip().startswith(("SELECT", "(SELECT")) and "FOR UPDATE" not in text
        if reads and "pikku_workflow_run" in text:
            seen.append((text, plan_text(text, params)))
        return execute(text, params, many, context)

    with connection.execute_wrapper(capture):
        call()
    return seen


class PruneBacklogPlanTests(TransactionTestCase):
    def test_a_prune_reads_index_ranges_that_leave_the_backlog_out(self) -> None:
        made = expired_runs()
        backlog_rows.analyze()
        alone = capture_selects(lambda: prune_runs(dry_run=True))
        before = [examined(text, params) for text, params in alone]
        backlog_rows.load(SIZE, SIZE)
        backlog_rows.load_children(CHILDREN)
        loaded = capture_selects(lambda: prune_runs(dry_run=True))
        assert [text for text, _ in alone] == [text for text, _ in loaded]
        # Room for an index a level deeper on each probe of a candidate, never
        # for a walk of the backlog.
        slack = 500 if connection.vendor == "sqlite" else 60 + 2 * len(made)
        for read, (text, params) in zip(before, loaded, strict=True):
            plan = plan_text(text, params)
            assert full_scans(plan) == [], (text, plan)
            after = examined(text, params)
            assert after <= 2 * read + slack, (read, after, text, plan)

    def test_the_deleting_pass_scans_no_runs(self) -> None:
        made = expired_runs()
        backlog_rows.load(SIZE, SIZE)
        backlog_rows.load_children(CHILDREN)
        seen = plans_of(prune_runs)
        assert seen
        for text, plan in seen:
            assert full_scans(plan) == [], (text, plan)
        assert not WorkflowRun.objects.filter(pk__in=made).exists()
        assert WorkflowRun.objects.count() == 2 * SIZE + CHILDREN
