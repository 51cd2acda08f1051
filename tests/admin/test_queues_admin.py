"""
The queues page ("Queues"): a row per queue with runs or configured, its
figures, pause/resume/drain as actions refused to view-only staff, the same
number of queries however many runs, ``?refresh=5``; and ``pikku_queues``.
"""

from __future__ import annotations

import json
import re
from io import StringIO

from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import TestCase, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pikku_django.models import Lease, WorkflowQueue, WorkflowRun
from pikku_django.queues import slot_keys
from pikku_django.store.queues import pause_queue
from tests.support import factories

URL = "admin:pikku_django_workflowqueue_changelist"


def make_run(queue: str, status: str = "running", wake_at: int | None = None) -> WorkflowRun:
    run = factories.make_run(queue=queue)
    WorkflowRun.objects.filter(pk=run.pk).update(status=status, wake_at=wake_at)
    return run


@override_settings(PIKKU_QUEUES={"emails": {"concurrency": 2}})
class QueuesPageTests(TestCase):
    def setUp(self) -> None:
        self.admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.admin)
        self.url = reverse(URL)

    def get(self, url: str) -> str:
        response = self.client.get(url)
        assert response.status_code == 200, response
        return response.content.decode()

    def test_the_index_links_to_queues(self) -> None:
        page = self.get(reverse("admin:index"))
        assert f'href="{self.url}"' in page
        assert ">Queues<" in page

    def test_each_queue_with_its_figures(self) -> None:
        now = Lease.objects.db_now_ms()
        make_run("emails", wake_at=now - 90_000)
        make_run("emails", wake_at=now - 1_000)
        make_run("emails", wake_at=now + 60_000)
        make_run("emails", "failed")
        make_run("reports", "completed")
        Lease.objects.acquire(slot_keys("emails", 2)[0], "w", 10_000)
        page = self.get(self.url)
        assert sorted(WorkflowQueue.objects.values_list("name", flat=True)) == ["emails", "reports"]
        emails = WorkflowQueue.objects.with_stats().get(name="emails")
        assert (emails.runs_running, emails.runs_failed, emails.due) == (3, 1, 2)  # type: ignore[attr-defined]
        assert "1 / 2" in page  # slots used / limit
        assert "1 min 30 s" in page or "1 min 31 s" in page  # the oldest due run's age, on the DB clock
        assert "∞" in page  # reports has no limit
        # The statuses a queue has runs of, each a link to them; none of the others.
        assert 'status=running">3 running</a><br>' in page and 'status=failed">1 failed</a>' in page
        cells = re.findall(r'<td class="field-runs_by_status">(.*?)</td>', page, re.S)
        assert len(cells) == 2 and not any(">0 " in cell for cell in cells), cells

    def test_pause_resume_and_drain_actions(self) -> None:
        now = Lease.objects.db_now_ms()
        runs = [make_run("emails", wake_at=now - 10) for _ in range(3)]
        self.get(self.url)
        queue = WorkflowQueue.objects.get(name="emails")
        self.client.post(self.url, {"action": "pause_queues", "_selected_action": [queue.pk]})
        assert WorkflowQueue.objects.get(pk=queue.pk).paused
        assert "paused" in self.get(self.url)
        self.client.post(self.url, {"action": "resume_queues", "_selected_action": [queue.pk]})
        assert not WorkflowQueue.objects.get(pk=queue.pk).paused
        self.client.post(self.url, {"action": "drain_queues", "_selected_action": [queue.pk]})
        assert set(
            WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)
        ) == {"cancelled"}

    def test_actions_are_refused_to_view_only_staff(self) -> None:
        self.get(self.url)
        queue = WorkflowQueue.objects.get(name="emails")
        clerk = User.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True)
        clerk.user_permissions.add(Permission.objects.get(codename="view_workflowqueue"))
        self.client.force_login(clerk)
        assert "Pause selected queues" not in self.get(self.url)
        self.client.post(self.url, {"action": "pause_queues", "_selected_action": [queue.pk]})
        assert not WorkflowQueue.objects.get(pk=queue.pk).paused

    def test_the_page_costs_the_same_queries_however_many_runs(self) -> None:
        make_run("emails")
        make_run("reports")
        self.get(self.url)  # warm caches, make the rows
        few = self.count_queries()
        now = timezone.now()
        many = [
            WorkflowRun(workflow="w", queue=("emails", "reports")[i % 2], created_at=now, updated_at=now)
            for i in range(500)
        ]
        WorkflowRun.objects.bulk_create(many)
        assert self.count_queries() == few

    def count_queries(self) -> int:
        with CaptureQueriesContext(connection) as captured:
            self.get(self.url)
        return len(captured.captured_queries)

    def test_refresh(self) -> None:
        response = self.client.get(self.url + "?refresh=5")
        assert response.status_code == 200
        assert response["Refresh"].startswith("5; url=")
        assert "refresh=5" in response["Refresh"]
        assert "Refresh" not in self.client.get(self.url)


class QueuesCommandTests(TestCase):
    def call(self, *args: str) -> str:
        out = StringIO()
        call_command("pikku_queues", *args, stdout=out)
        return out.getvalue()

    def test_list_json_pause_and_resume(self) -> None:
        make_run("emails", wake_at=0)
        rows = json.loads(self.call("--json"))
        assert [row["name"] for row in rows] == ["emails"]
        assert rows[0]["runs"]["running"] == 1 and rows[0]["due"] == 1 and not rows[0]["paused"]
        assert self.call("--pause", "emails") == "Paused emails.\n"
        assert self.call("--pause", "emails") == "emails was paused already; nothing changed.\n"
        assert "emails (paused): 1 running" in self.call()
        assert self.call("--resume", "emails") == "Resumed emails.\n"
        assert not WorkflowQueue.objects.get(name="emails").paused
        pause_queue("new")
        assert json.loads(self.call("--json"))[1]["name"] == "new"
