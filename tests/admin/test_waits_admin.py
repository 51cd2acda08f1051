"""The run admin says why a run waits, links parents and children, and cancels through the one path."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import connection
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.admin import WorkflowRunAdmin
from pikku_django.admin.base import short_uuid
from pikku_django.admin.waits import describe_wait
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.workflows import run_workflow, send_signal, start_workflow


def change_url(run: WorkflowRun) -> str:
    return reverse("admin:pikku_django_workflowrun_change", args=[run.pk])


class WaitingRunAdminTests(TransactionTestCase):
    def setUp(self) -> None:
        self.user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.user)
        self.runs_url = reverse("admin:pikku_django_workflowrun_changelist")
        self.sleeper = run_workflow(start_workflow("test.sleeper", {"ms": 3_600_000}).pk)
        self.waiter = run_workflow(start_workflow("test.signals", {"name": "approval", "waits": 1}).pk)
        self.parent = run_workflow(
            start_workflow("test.parent", {"child": "test.sleeper"}, timeout_ms=600_000).pk
        )
        self.child = WorkflowRun.objects.get(parent=self.parent)

    def get(self, url: str) -> str:
        response = self.client.get(url)
        assert response.status_code == 200
        return response.content.decode()

    def test_the_list_says_why_each_run_waits_and_links_the_parent(self) -> None:
        body = self.get(self.runs_url)
        assert "sleeping until " in body and "(in 59 min" in body
        assert "waiting for signal &quot;approval&quot; since " in body
        assert f'waiting for child <a href="{change_url(self.child)}">{short_uuid(self.child.pk)}</a>' in body
        assert f'<a href="{change_url(self.parent)}">{short_uuid(self.parent.pk)}</a>' in body

    def test_the_list_costs_the_same_queries_however_many_runs_wait(self) -> None:
        def count() -> int:
            self.get(self.runs_url)
            with CaptureQueriesContext(connection) as queries:
                self.get(self.runs_url)
            return len(queries)

        few = count()
        for _ in range(5):
            run_workflow(start_workflow("test.signals", {"name": "more", "waits": 1}).pk)
            run_workflow(start_workflow("test.parent", {"child": "test.double", "child_input": 1}).pk)
        assert count() == few

    def test_the_page_shows_parent_children_deadline_and_wait(self) -> None:
        body = self.get(change_url(self.parent))
        assert (
            f'<a href="{change_url(self.child)}">{short_uuid(self.child.pk)}</a> test.sleeper (running)'
            in body
        )
        assert "waiting for child" in body and " UTC (in " in body  # the deadline, ten minutes off
        send_signal(self.waiter.pk, "approval", {"by": "ana"})
        body = self.get(change_url(self.waiter))
        assert "Workflow signals" in body and "&quot;by&quot;: &quot;ana&quot;" in body
        body = self.get(change_url(self.child))
        assert f'<a href="{change_url(self.parent)}">{short_uuid(self.parent.pk)}</a>' in body
        # A run fetched without the list's annotations describes its wait too.
        now = Lease.objects.db_now_ms()
        assert describe_wait(WorkflowRun.objects.get(pk=self.waiter.pk), now).startswith(
            'waiting for signal "approval" since '
        )
        assert describe_wait(WorkflowRun.objects.get(pk=self.sleeper.pk), now).startswith("sleeping until ")
        done = start_workflow("test.double", 1, inline=True)
        assert describe_wait(done, now) is None
        assert WorkflowRunAdmin  # the registered admin renders these columns

    def test_the_cancel_action_cancels_children_and_fences_steps(self) -> None:
        response = self.client.post(
            self.runs_url, {"action": "cancel_runs", "_selected_action": [self.parent.pk]}, follow=True
        )
        assert "Cancelled 1 run." in response.content.decode()
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert (statuses[self.parent.pk], statuses[self.child.pk]) == ("cancelled", "cancelled")
        assert statuses[self.sleeper.pk] == "running"
        parked = WorkflowStep.objects.get(run=self.parent, step_name="child")
        assert (parked.status, parked.error["type"]) == (
            "failed",
            "pikku_django.errors.WorkflowCancelledError",
        )
