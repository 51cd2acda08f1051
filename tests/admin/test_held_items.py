"""
A fan-out's items not released yet are stored ``suspended``, but a reader is
shown them as pending (held by their fan-out) wherever a status is shown:
the run list, a run's page, the status filter, the queues page and
``pikku_queues``; a child that waits for a signal is still ``suspended``.
"""

from __future__ import annotations

import json
import re
from io import StringIO

from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import TransactionTestCase
from django.urls import reverse

from pikku_django.managers.held import PENDING_LABEL
from pikku_django.models import WorkflowRun
from pikku_django.workflows import run_workflow, start_workflow

RUNS = "admin:pikku_django_workflowrun_changelist"


def rows_of(page: str, run: WorkflowRun) -> list[str]:
    """The run list's rows of ``run`` (by its id's cell: its parent's rows link to it too)."""
    cell = re.compile(r'class="field-short_id"><a [^>]*>' + str(run.pk)[:8] + "<")
    return [row for row in page.split("<tr") if cell.search(row)]


def listed(page: str, run: WorkflowRun) -> bool:
    return bool(rows_of(page, run))


def row_status(page: str, run: WorkflowRun) -> str:
    """The status the run list's row of ``run`` shows."""
    rows = rows_of(page, run)
    assert len(rows) == 1, f"{run.pk} is on {len(rows)} rows"
    found = re.search(r'<td class="field-status_display"><strong[^>]*>([^<]*)</strong>', rows[0])
    assert found, rows[0]
    return found.group(1)


class HeldItemTests(TransactionTestCase):
    def setUp(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)
        # Three children one at a time: the first released, and waiting for its
        # signal (suspended); the other two held by their fan-out.
        self.parent = start_workflow("test.signal_children", {"n": 3}, queue="kids")
        run_workflow(self.parent.pk)
        self.children = list(WorkflowRun.objects.filter(parent=self.parent).order_by("parent_index"))
        assert len(self.children) == 3
        run_workflow(self.children[0].pk)
        self.children = [WorkflowRun.objects.get(pk=child.pk) for child in self.children]
        self.waiting, self.held = self.children[0], self.children[1:]
        assert [child.status for child in self.children] == ["suspended"] * 3
        assert [child.wake_at for child in self.children] == [None] * 3

    def get(self, url: str) -> str:
        response = self.client.get(url)
        assert response.status_code == 200, response
        return response.content.decode()

    def test_the_list_shows_held_items_as_pending(self) -> None:
        page = self.get(reverse(RUNS) + "?items=all")
        assert row_status(page, self.waiting) == "suspended"
        for child in self.held:
            assert row_status(page, child) == PENDING_LABEL
        assert row_status(page, self.parent) == "running"

    def test_a_held_items_page_shows_it_pending(self) -> None:
        page = self.get(reverse("admin:pikku_django_workflowrun_change", args=[self.held[0].pk]))
        assert PENDING_LABEL in page
        assert ">suspended<" not in page
        page = self.get(reverse("admin:pikku_django_workflowrun_change", args=[self.waiting.pk]))
        assert ">suspended<" in page and PENDING_LABEL not in page

    def test_the_status_filter_tells_held_from_suspended(self) -> None:
        pending = self.get(reverse(RUNS) + "?status=pending")
        assert PENDING_LABEL in pending
        assert all(listed(pending, child) for child in self.held)
        assert not listed(pending, self.waiting) and not listed(pending, self.parent)
        suspended = self.get(reverse(RUNS) + "?status=suspended&items=all")
        assert listed(suspended, self.waiting)
        assert not any(listed(suspended, child) for child in self.held)

    def test_the_cockpit_counts_held_items_as_pending(self) -> None:
        out = StringIO()
        call_command("pikku_queues", "--json", stdout=out)
        rows = {row["name"]: row for row in json.loads(out.getvalue())}
        assert rows["kids"]["runs"] == {
            "running": 1,
            "pending": 2,
            "suspended": 1,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
        }
        out = StringIO()
        call_command("pikku_queues", stdout=out)
        assert "kids: 1 running, 2 pending, 1 suspended, 0 completed" in out.getvalue()
        page = self.get(reverse("admin:pikku_django_workflowqueue_changelist"))
        assert "2 pending</a>" in page and "1 suspended</a>" in page
        assert "status=pending" in page
