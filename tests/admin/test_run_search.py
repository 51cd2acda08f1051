"""
The run list's search on a large table whose runs mostly have no
idempotency key: a run id, whole or its first characters, is found by index
probes whatever the planner's statistics, and never by a scan of the runs.
"""

from __future__ import annotations

import re
from typing import Any
from unittest import skipIf

from django.contrib.auth.models import User
from django.db import connection
from django.test import TransactionTestCase
from django.urls import reverse

from pikku_django.models import WorkflowRun
from tests.support import backlog_rows
from tests.support.plans import plan_text

#: Runs loaded without an idempotency key, all of one workflow, then ANALYZEd.
BACKLOG = 20_000


def listed(page: str, run: WorkflowRun) -> bool:
    """Is ``run`` a row of the run list (its id's cell, not the search box's echo of the term)?"""
    return bool(re.search(r'class="field-short_id"><a [^>]*>' + str(run.pk)[:8] + "<", page))


def scans_runs(plan: str) -> bool:
    """Does the plan read the whole run table (or the whole of one of its indexes)?"""
    table = WorkflowRun._meta.db_table
    if connection.vendor == "sqlite":
        return any(line.strip().startswith(f"SCAN {table}") for line in plan.splitlines())
    if connection.vendor == "mysql":
        # EXPLAIN's row, its columns in order: ... table type key ...
        return any(
            f" {table} {kind} " in f" {line} " for line in plan.splitlines() for kind in ("ALL", "index")
        )
    return f"Seq Scan on {table}" in plan or f"Scan Backward using pikku_run_created_idx on {table}" in plan


class RunSearchPlanTests(TransactionTestCase):
    def setUp(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)
        self.url = reverse("admin:pikku_django_workflowrun_changelist")
        self.keyed = WorkflowRun.objects.create_run("backlog", idempotency_key="order-77")
        self.other = WorkflowRun.objects.create_run("backlog")
        backlog_rows.load(future=BACKLOG, queued=0)

    def searched(self, term: str) -> tuple[str, list[str]]:
        """The changelist searched for ``term``, and the plans of its reads of the runs that filter them."""
        captured: list[tuple[str, Any]] = []
        table = WorkflowRun._meta.db_table

        def capture(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
            if text.lstrip().startswith("SELECT") and table in text and " WHERE " in text:
                captured.append((text, params))
            return execute(text, params, many, context)

        with connection.execute_wrapper(capture):
            response = self.client.get(self.url, {"q": term})
        assert response.status_code == 200
        return response.content.decode(), [plan_text(text, params) for text, params in captured]

    def test_a_whole_id_is_found_by_probes_not_a_scan(self) -> None:
        for term in (str(self.keyed.pk), self.keyed.pk.hex.upper()):
            body, plans = self.searched(term)
            assert listed(body, self.keyed) and not listed(body, self.other), term
            assert plans, term
            for plan in plans:
                assert not scans_runs(plan), (term, plan)

    def test_a_key_is_found_by_its_own_probe(self) -> None:
        body, plans = self.searched("order-77")
        assert listed(body, self.keyed) and not listed(body, self.other)
        assert plans

    @skipIf(
        connection.vendor == "mysql",
        "MariaDB's uuid type does not order ids as their text: an id prefix is no range of it",
    )
    def test_a_prefix_shared_by_runs_finds_each_by_a_range(self) -> None:
        body, plans = self.searched(str(self.keyed.pk)[:8])
        assert listed(body, self.keyed) and not listed(body, self.other)
        for plan in plans:
            assert not scans_runs(plan), plan
        # The backlog's ids 0x10 to 0x1f share these first 35 characters.
        body, plans = self.searched(f"{backlog_rows.FUTURE_PREFIX}-0000-4000-8000-00000000001")
        assert not listed(body, self.keyed)
        assert "16 results" in body
        for plan in plans:
            assert not scans_runs(plan), plan
        # A prefix that every backlog run shares: the first 1,000 of them, by id.
        body, _ = self.searched(backlog_rows.FUTURE_PREFIX)
        assert "1000 results" in body
