"""
``metrics/`` (``pikku_django.urls``): Prometheus text that parses, whose
figures equal the database's, read in the same number of queries however
many runs are kept; for staff or the bearer of ``PIKKU_METRICS_TOKEN`` only.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.test import TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sql.names import NameLock
from pikku_django.store.workers import Beat, beat
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.children import poll_until
from tests.support.factories import lapse_step

URL = "/pikku/metrics/"
#: The bearer token the tests set (not a secret).
TOKEN = "metrics-" + "token"
PLAIN_STEP = "testproject.testing.workflows.plain_step"


def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Each sample's value by its name and labels."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


class MetricsTests(TransactionTestCase):
    def setUp(self) -> None:
        self.staff = User.objects.create_user("ops", is_staff=True)

    def scrape(self) -> str:
        self.client.force_login(self.staff)
        response = self.client.get(URL)
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain")
        return response.content.decode()

    def some_runs(self) -> None:
        for _ in range(2):
            start_workflow("test.steps", {"steps": 2}, inline=True)
        start_workflow("test.fragile", {"path": str(Path(tempfile.mkdtemp()) / "never")}, inline=True)
        start_workflow("test.steps", {"steps": 1}, queue="emails")
        # A step whose worker was lost, taken over by the next pass.
        lost = start_workflow("test.steps", {"steps": 1})
        step = WorkflowStep.objects.insert_step(lost, "s0", PLAIN_STEP, retries=2)
        WorkflowStep.objects.claim(lost.pk, "s0", PLAIN_STEP, 60_000, holder="gone-worker")
        lapse_step(step)
        run_workflow(lost.pk)

    def test_figures_equal_the_database(self) -> None:
        self.some_runs()
        found = samples(self.scrape())
        runs = Counter(WorkflowRun.objects.values_list("queue", "status"))
        assert found["pikku_runs"] == {
            (("queue", queue), ("status", status)): float(n) for (queue, status), n in runs.items()
        }
        assert runs[("emails", "running")] == 1
        assert found["pikku_queue_oldest_due_seconds"][(("queue", "emails"),)] >= 0
        assert found["pikku_queue_oldest_due_seconds"][(("queue", "default"),)] == 0
        attempts = Counter(WorkflowStepAttempt.objects.values_list("status", flat=True))
        assert found["pikku_attempts_total"][(("outcome", "succeeded"),)] == attempts["succeeded"]
        assert found["pikku_attempts_total"][(("outcome", "failed"),)] == attempts["failed"] == 2
        assert found["pikku_attempts_total"][(("outcome", "lost"),)] == 1
        assert found["pikku_worker_lost_total"][()] == 1
        # Every run started but the one due on "emails": its start delay counted once.
        started = WorkflowRun.objects.filter(steps__attempts__running_at__isnull=False).distinct()
        assert found["pikku_start_delay_seconds_count"][(("queue", "default"),)] == started.count() == 4
        inf = found["pikku_start_delay_seconds_bucket"][(("le", "+Inf"), ("queue", "default"))]
        assert inf == 4
        ended = WorkflowStepAttempt.objects.filter(status__in=("succeeded", "failed"))
        by_workflow = Counter(ended.values_list("step__run__workflow", flat=True))
        for workflow, n in by_workflow.items():
            assert found["pikku_step_duration_seconds_count"][(("workflow", workflow),)] == n
            buckets = sorted(
                (float(dict(labels)["le"]), value)
                for labels, value in found["pikku_step_duration_seconds_bucket"].items()
                if dict(labels)["workflow"] == workflow
            )
            assert [value for _, value in buckets] == sorted(value for _, value in buckets)
            assert buckets[-1][1] == n

    def test_live_workers_are_the_rows_whose_names_are_held(self) -> None:
        # Idle or busy, a worker counts while it holds its name; a row left
        # by a killed one does not, nor does a run lease's holder.
        for holder in ("w1", "w2", "killed"):
            beat("default", Beat(holder=holder, host="h", pid=1, lanes=1, queues="", runs_in_hand=0))
        Lease.objects.acquire("workflow-run:x", "w3", 60_000)
        locks = [NameLock(connection.alias, name) for name in ("w1", "w2", "w3")]
        try:
            assert all(lock.acquire() for lock in locks)
            assert samples(self.scrape())["pikku_workers_live"][()] == 2
            locks[0].release()
            # The server ends the lock's session right after it is closed.
            poll_until(lambda: samples(self.scrape())["pikku_workers_live"][()] == 1, timeout=5)
        finally:
            for lock in locks:
                lock.release()

    def test_a_fan_outs_held_items_are_pending_not_suspended(self) -> None:
        # Three children one at a time: one waits for its signal, two are held.
        parent = start_workflow("test.signal_children", {"n": 3}, queue="kids")
        run_workflow(parent.pk)
        first = WorkflowRun.objects.get(parent=parent, parent_index=0)
        run_workflow(first.pk)
        assert WorkflowRun.objects.filter(queue="kids", status="suspended").count() == 3
        found = samples(self.scrape())["pikku_runs"]
        assert found[(("queue", "kids"), ("status", "suspended"))] == 1
        assert found[(("queue", "kids"), ("status", "pending"))] == 2
        assert found[(("queue", "kids"), ("status", "running"))] == 1

    def test_a_scrape_reads_the_same_number_of_queries_however_many_runs(self) -> None:
        self.some_runs()
        self.client.force_login(self.staff)
        self.client.get(URL)

        def counted() -> int:
            with CaptureQueriesContext(connection) as queries:
                assert self.client.get(URL).status_code == 200
            return len(queries)

        before = counted()
        self.some_runs()
        for i in range(20):
            start_workflow("test.steps", {"steps": 1}, queue=f"q{i % 3}")
        assert counted() == before

    @override_settings(PIKKU_METRICS_TOKEN=TOKEN)
    def test_only_staff_or_the_token_bearer_may_read(self) -> None:
        assert self.client.get(URL).status_code == 403
        self.client.force_login(User.objects.create_user("someone"))
        assert self.client.get(URL).status_code == 403
        self.client.logout()
        assert self.client.get(URL, headers={"Authorization": "Bearer wrong"}).status_code == 403
        assert self.client.get(URL, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 403
        response = self.client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        assert "pikku_runs" in response.content.decode()

    def test_without_a_token_only_staff_may_read(self) -> None:
        response: Any = self.client.get(URL, headers={"Authorization": "Bearer "})
        assert response.status_code == 403
        assert "pikku_runs" in self.scrape()
