"""
The cockpit's pages cost the same number of queries with 100 runs kept and
with 100,000: the queues, workers, workflows and runs pages, a queue's page,
a run's page, and the runs list filtered and searched. The runs are loaded in
one INSERT ... SELECT (a quarter each running, suspended, completed and
failed, over three queues and fifty keys), inside the test's transaction.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.models import Lease, WorkflowQueue, WorkflowRun, WorkflowWorker
from tests.support import backlog_rows

KEPT = 100_000


class PagesAtScaleTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        now = Lease.objects.db_now_ms()
        for holder in ("w1", "w2"):
            WorkflowWorker.objects.create(holder=holder, host="h", pid=1, started_at=now, seen_at=now)

    def queries(self, url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            response = self.client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return len(captured.captured_queries)

    def urls(self, run: WorkflowRun) -> list[str]:
        runs = reverse("admin:pikku_django_workflowrun_changelist")
        self.queries(reverse("admin:pikku_django_workflowqueue_changelist"))  # makes the queues' rows
        queue = WorkflowQueue.objects.get(name="emails")
        return [
            reverse("admin:pikku_django_workflowqueue_changelist"),
            reverse("admin:pikku_django_workflowqueue_change", args=[queue.pk]),
            reverse("admin:pikku_django_workflowworker_changelist"),
            reverse("admin:pikku_django_workflowoverview_changelist"),
            runs,
            runs + "?status=failed",
            runs + "?q=k7",
            reverse("admin:pikku_django_workflowrun_change", args=[run.pk]),
        ]

    def test_the_pages_cost_the_same_queries_with_100_runs_and_with_100000(self) -> None:
        assert backlog_rows.load_mixed(100) == 100
        run = WorkflowRun.objects.filter(status="failed").first()
        assert run is not None
        urls = self.urls(run)
        for url in urls:
            self.queries(url)  # warm caches, make the queues' rows
        few = [self.queries(url) for url in urls]
        more = backlog_rows.load_mixed(KEPT - 100, workflow="more", prefix=backlog_rows.MORE_PREFIX)
        assert more == KEPT - 100
        assert WorkflowRun.objects.count() == KEPT
        many = [self.queries(url) for url in urls]
        assert many == few, list(zip(urls, few, many, strict=True))
