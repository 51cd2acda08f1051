"""
A run's page leads with its summary (status, name, queue, age, the error's
last line) and timeline, then its steps; retry, cancel and fork are buttons
refused to view-only staff; errors are readable tracebacks; the runs list
shows a task's name, an error column and colours, hides a fan-out's items
by default, takes ``?refresh=5``, and costs the same queries however many runs.
"""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pikku_django.admin.run_page import error_last_line
from pikku_django.models import WorkflowRun
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing import tasks

RUNS = "admin:pikku_django_workflowrun_changelist"


def page_url(run: WorkflowRun) -> str:
    return reverse("admin:pikku_django_workflowrun_change", args=[run.pk])


class RunPageTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))

    def get(self, url: str) -> str:
        response = self.client.get(url)
        assert response.status_code == 200, response
        return response.content.decode()

    def test_the_page_leads_with_the_summary_then_the_timeline_then_the_steps(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        page = self.get(page_url(failed))
        summary = page.index("field-summary")
        assert summary < page.index("field-timeline") < page.index("field-id")
        assert page.index("field-timeline") < page.index('id="steps-group"')
        line = error_last_line(WorkflowRun.objects.get(pk=failed.pk).error)
        assert line and line.split(":")[0] in page[summary : page.index("field-timeline")]
        # The traceback as text: real lines, not a JSON string with \n escapes.
        assert "Traceback (most recent call last):\n" in page
        assert "\\n" not in page[page.index("field-error_json") :][:2000]

    def test_retry_cancel_and_fork_buttons(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        page = self.get(page_url(failed))
        retry = reverse("admin:pikku_django_workflowrun_retry", args=[failed.pk])
        assert f'formaction="{retry}"' in page
        response = self.client.post(retry)
        assert response.status_code == 302 and response["Location"] == page_url(failed)
        assert WorkflowRun.objects.get(pk=failed.pk).status == "running"
        cancel = reverse("admin:pikku_django_workflowrun_cancel", args=[failed.pk])
        assert f'formaction="{cancel}"' in self.get(page_url(failed))
        self.client.post(cancel)
        assert WorkflowRun.objects.get(pk=failed.pk).status == "cancelled"
        assert self.client.get(cancel).status_code == 405
        fork = reverse("admin:pikku_django_workflowrun_fork", args=[failed.pk])
        assert self.client.post(fork, {"do": "fork"}).status_code == 302
        assert WorkflowRun.objects.filter(forked_from=failed.pk).exists()

    def test_view_only_staff_see_no_buttons_and_are_refused(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        clerk = User.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True)
        clerk.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
        self.client.force_login(clerk)
        page = self.get(page_url(failed))
        assert "/retry/" not in page and "/cancel/" not in page
        for name in ["retry", "cancel", "fork"]:
            url = reverse(f"admin:pikku_django_workflowrun_{name}", args=[failed.pk])
            assert self.client.post(url).status_code == 403
        assert WorkflowRun.objects.get(pk=failed.pk).status == "failed"

    def test_the_list_shows_names_errors_and_colours(self) -> None:
        tasks.add.enqueue(1, 2)
        failed = start_workflow("test.fails", None, inline=True)
        page = self.get(reverse(RUNS))
        assert "testproject.testing.tasks.add" in page
        assert error_last_line(WorkflowRun.objects.get(pk=failed.pk).error)[:40] in page
        assert "color: #c62828" in page  # failed

    def test_a_child_shows_its_parent_under_its_name(self) -> None:
        parent = start_workflow("test.parent", {"child": "test.double", "child_input": 2})
        Worker(holder="w", once=True, max_runs=1).run()
        child = WorkflowRun.objects.get(parent=parent)
        page = self.get(reverse(RUNS))
        row = page[page.index(str(child.pk)[:8]) :]
        row = row[: row.index("</tr>")]
        assert f'<small>of <a href="{page_url(parent)}">{str(parent.pk)[:8]}</a></small>' in row
        assert "parent" not in page[page.index("<thead>") : page.index("</thead>")].lower()

    def test_the_page_leaves_off_what_the_run_does_not_have(self) -> None:
        plain = start_workflow("test.double", 2, inline=True)
        page = self.get(page_url(plain))
        for absent in ("wake_display", "deadline_display", "parent_display", "dedup_key", "error_json"):
            assert f"field-{absent}" not in page, absent
        assert "field-output_json" in page and "field-summary" in page
        keyed = start_workflow("test.double", 2, key="tenant-1", timeout_ms=60_000)
        page = self.get(page_url(keyed))
        assert "field-key" in page and "tenant-1" in page
        assert "field-deadline_display" in page and "field-wake_display" in page
        assert "field-output_json" not in page

    def test_a_fan_outs_items_are_hidden_from_the_list_by_default(self) -> None:
        parent = start_workflow("test.map", {"items": [1, 2, 3]})
        Worker(holder="w", once=True, max_runs=1).run()
        items = list(WorkflowRun.objects.filter(parent_step__isnull=False))
        assert len(items) == 3
        page = self.get(reverse(RUNS))
        assert str(parent.pk)[:8] in page
        assert not any(str(item.pk)[:8] in page for item in items)
        shown = self.get(reverse(RUNS) + "?items=all")
        assert all(str(item.pk)[:8] in shown for item in items)
        step = items[0].parent_step_id
        assert all(str(item.pk)[:8] in self.get(reverse(RUNS) + f"?parent_step={step}") for item in items)

    def test_the_list_takes_refresh(self) -> None:
        response = self.client.get(reverse(RUNS) + "?refresh=5")
        assert response.status_code == 200 and response["Refresh"].startswith("5; url=")

    def test_the_list_costs_the_same_queries_however_many_runs(self) -> None:
        start_workflow("test.fails", None, inline=True)
        self.get(reverse(RUNS))
        with CaptureQueriesContext(connection) as few:
            self.get(reverse(RUNS))
        now = timezone.now()
        WorkflowRun.objects.bulk_create(
            [WorkflowRun(workflow="w", queue="q", created_at=now, updated_at=now) for _ in range(300)]
        )
        with CaptureQueriesContext(connection) as many:
            self.get(reverse(RUNS))
        assert len(many.captured_queries) == len(few.captured_queries)
