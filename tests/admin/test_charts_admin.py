"""
The cockpit's charts (``admin.charts``, from the per-minute rollup): on each
queue's row and page, and on the "Workflows" page (one row per workflow
name), each bar's figure in its ``<title>``; the queues' busiest keys. What
the pages cost with 100,000 runs kept is in test_pages_at_scale.py.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pikku_django.admin.chart_data import DAY, HOUR, Slot, empty, percentile, read_series
from pikku_django.admin.charts import delay_chart, throughput_chart
from pikku_django.models import Lease, WorkflowMinute, WorkflowQueue, WorkflowRun
from pikku_django.store import rollup

QUEUES = "admin:pikku_django_workflowqueue_changelist"
WORKFLOWS = "admin:pikku_django_workflowoverview_changelist"


def minute_ago(minutes: int) -> int:
    """The first instant of the minute ``minutes`` before the database clock's current one."""
    now = Lease.objects.db_now_ms()
    return (now // 60_000 - minutes) * 60_000


def add_minute(minutes: int, queue: str, workflow: str, **counts: Any) -> WorkflowMinute:
    return WorkflowMinute.objects.create(minute=minute_ago(minutes), queue=queue, workflow=workflow, **counts)


def make_runs(count: int, queue: str = "emails", key: str | None = None) -> None:
    now = timezone.now()
    WorkflowRun.objects.bulk_create(
        [
            WorkflowRun(workflow="w", queue=queue, key=key, wake_at=0, created_at=now, updated_at=now)
            for _ in range(count)
        ],
        batch_size=1000,
    )


def titles(page: str) -> list[str]:
    return re.findall(r"<title>([^<]*)</title>", page)


class ChartDrawingTests(TestCase):
    def test_each_bar_has_its_figure_in_its_title(self) -> None:
        series = empty(HOUR, 3_600_000 * 13 + 5 * 60_000)  # 13:05 UTC on 1 Jan 1970
        last = series.slots[-1]
        last.add(42, 3, [0, 0, 0, 40, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0])
        svg = throughput_chart(series)
        assert svg.startswith("<svg")
        assert titles(svg) == ["13:05 UTC: 42 completed", "13:05 UTC: 3 failed"]
        delays = titles(delay_chart(series))
        assert delays == [
            "13:05 UTC: start delay p95 ≤ 2.5 s (43 starts)",
            "13:05 UTC: start delay p50 ≤ 250 ms (43 starts)",
        ]

    def test_a_day_is_drawn_in_quarters_of_an_hour(self) -> None:
        series = empty(DAY, 3_600_000 * 13 + 5 * 60_000)
        assert len(series.slots) == 96
        series.slots[-1].add(1, 0, [0] * 15)
        assert titles(throughput_chart(series)) == ["13:00–13:15 UTC: 1 completed"]

    def test_percentiles_of_the_buckets(self) -> None:
        assert percentile([0] * 15, 0.5) is None
        assert percentile([1, 1, 0, 0] + [0] * 11, 0.5) == 0
        assert percentile([1, 1, 0, 0] + [0] * 11, 0.95) == 1
        assert percentile([0, 0, 0] + [0] * 11 + [5], 0.5) == 14
        slot = Slot(0)
        slot.add(1, 2, [1] * 15)
        assert (slot.completed, slot.failed, sum(slot.delays)) == (1, 2, 15)

    def test_the_series_sum_the_rollup_per_slot(self) -> None:
        add_minute(0, "emails", "a", completed=2, delay_0=2)
        add_minute(0, "emails", "b", completed=1, failed=1, delay_5=1)
        add_minute(2, "emails", "a", failed=4)
        add_minute(2, "reports", "a", completed=7)
        add_minute(90, "emails", "a", completed=100)  # out of the hour, in the day
        now = Lease.objects.db_now_ms()
        hour = read_series("default", "queue", HOUR, now)
        assert (hour["emails"].completed, hour["emails"].failed) == (3, 5)
        assert hour["emails"].slots[-1].delays[0] == 2
        day = read_series("default", "workflow", DAY, now)
        assert (day["a"].completed, day["a"].failed, day["b"].completed) == (109, 4, 1)


class ChartPagesTests(TestCase):
    def setUp(self) -> None:
        self.admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.admin)

    def get(self, url: str) -> str:
        response = self.client.get(url)
        assert response.status_code == 200, response
        return response.content.decode()

    def count_queries(self, url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            self.get(url)
        return len(captured.captured_queries)

    def test_the_index_links_to_workflows(self) -> None:
        page = self.get(reverse("admin:index"))
        assert f'href="{reverse(WORKFLOWS)}"' in page
        assert ">Workflows<" in page

    def test_the_workflows_page_has_a_row_per_workflow_with_its_charts(self) -> None:
        add_minute(0, "emails", "test.double", completed=5, failed=1, delay_3=6)
        add_minute(1, "reports", "test.double", completed=2)
        add_minute(3, "emails", "testproject.testing.tasks.add", failed=2)
        add_minute(200, "emails", "test.old", completed=1)
        page = self.get(reverse(WORKFLOWS))
        cells = re.findall(r'<td class="field-name">(.*?)</td>', page, re.S)
        names = [re.sub(r"<[^>]+>", "", cell) for cell in cells]
        assert names == ["test.double", "test.old", "testproject.testing.tasks.add"], names
        assert "7 completed, 1 failed; start delay p50 ≤ 250 ms, p95 ≤ 250 ms" in page
        shown = titles(page)
        assert any(title.endswith(": 5 completed") for title in shown), shown
        assert any(title.endswith(": 2 failed") for title in shown), shown
        assert any("start delay p50 ≤ 250 ms (6 starts)" in title for title in shown), shown
        assert '?workflow=test.double"' in page  # a registered workflow links to its runs

    def test_each_queue_shows_its_charts_and_busiest_keys(self) -> None:
        add_minute(0, "emails", "test.double", completed=5, failed=1)
        for n, key in enumerate(["a", "b", "c", "d", "e", "f"]):
            make_runs(n + 1, key=key)
        make_runs(2, queue="reports", key="z")
        page = self.get(reverse(QUEUES))
        assert "f</a> (6), " in page and "b</a> (2)" in page
        assert "a</a> (1)" not in page  # the sixth key of emails
        assert "z</a> (2)" in page
        assert "key=f" in page
        shown = titles(page)
        assert any(title.endswith(": 5 completed") for title in shown), shown
        queue = WorkflowQueue.objects.get(name="emails")
        one = self.get(reverse("admin:pikku_django_workflowqueue_change", args=[queue.pk]))
        assert "last day: 5 completed, 1 failed" in one and "last hour: 5 completed, 1 failed" in one
        assert "f</a> (6)" in one

    def test_outside_a_page_a_queue_reads_its_own_charts(self) -> None:
        rollup.add_within("default", [rollup.Ended("emails", "w", "completed", 1)])
        make_runs(1)
        self.get(reverse(QUEUES))
        queue = WorkflowQueue.objects.get(name="emails")
        page = self.get(reverse("admin:pikku_django_workflowqueue_change", args=[queue.pk]))
        assert "last hour: 1 completed, 0 failed" in page
