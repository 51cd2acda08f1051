"""
A sweep pass with a backlog: runs asleep until later and queued tasks (each
with the pending step ``enqueue`` stores) are no work of the sweep, and each
of its statements reads an index range that leaves them out, on SQLite as on
PostgreSQL and MariaDB (issue 30): no statement scans the runs, and none
reads more with the backlog than on empty tables.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.sweep import sweep
from tests.support import backlog_rows
from tests.support.factories import age, make_run, make_step
from tests.support.plans import capture_selects, examined, plan_text

# Planner statistics are per table: run apart from the other plan tests.
pytestmark = pytest.mark.xdist_group("query_plans")

SIZE = 4_000


def a_pass() -> object:
    """
    A pass without the retention prune: its walk of finished runs reads none
    of a backlog of unfinished ones, and its probes of their trees run per
    finished run found (``tests/sweep/test_retention*.py``).
    """
    return sweep(dry_run=True, prune=False)


def full_scans(plan: str) -> list[str]:
    """The lines of ``plan`` that read the whole run or step table (or a whole index; U0: a subquery's)."""
    tables = r"(pikku_workflow_(run|step)|U\d+)"
    if connection.vendor == "sqlite":
        pattern = rf"SCAN {tables}\b"
    elif connection.vendor == "postgresql":
        pattern = rf"Seq Scan on {tables}\b"
    else:
        # MariaDB's EXPLAIN: the table's row, its access type ALL (a scan) or index (a whole index).
        pattern = rf" {tables} (ALL|index) "
    return [line for line in plan.splitlines() if re.search(pattern, f" {line} ")]


class SweepBacklogPlanTests(TransactionTestCase):
    def found(self) -> tuple[Any, Any]:
        """A stalled run and a run with an undispatched step: what a sweep pass is for."""
        stalled, undispatched = make_run(), make_run()
        WorkflowRun.objects.filter(pk=stalled.pk).update(wake_at=None)
        age(WorkflowRun, stalled.pk, 3_600_000)
        WorkflowRun.objects.filter(pk=undispatched.pk).update(wake_at=0)
        age(WorkflowStep, make_step(undispatched).pk, 3_600_000)
        return stalled, undispatched

    def test_a_pass_reads_index_ranges_that_leave_the_backlog_out(self) -> None:
        backlog_rows.analyze()
        empty = capture_selects(a_pass)
        # What each statement reads on empty tables, read before the backlog is loaded.
        before = [examined(text, params) for text, params in empty]
        backlog_rows.load(SIZE, SIZE)
        assert backlog_rows.load_pending_steps() == SIZE
        loaded = capture_selects(a_pass)
        assert [text for text, _ in empty] == [text for text, _ in loaded]
        # Room for an index a level deeper, never for a walk of the backlog.
        slack = 500 if connection.vendor == "sqlite" else 60
        for read, (text, params) in zip(before, loaded, strict=True):
            plan = plan_text(text, params)
            assert full_scans(plan) == [], (text, plan)
            after = examined(text, params)
            assert after <= 2 * read + slack, (read, after, text, plan)

    def test_the_pass_still_finds_what_it_is_for(self) -> None:
        backlog_rows.load(SIZE, SIZE)
        backlog_rows.load_pending_steps()
        report = sweep(dry_run=True, stalled_after_ms=60_000)
        assert (report.stalled_runs, report.undispatched_runs) == (0, 0)
        stalled, undispatched = self.found()
        report = sweep(stalled_after_ms=60_000)
        assert (report.stalled_runs, report.undispatched_runs, report.woken_runs) == (1, 1, 2), report
        assert WorkflowRun.objects.filter(wake_at=0).count() == 2
        assert WorkflowStep.objects.filter(status="pending").count() == SIZE + 1
