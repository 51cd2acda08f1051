"""
The worker's heartbeat (``worker.beat``, ``store.workers``) and the admin's
Workers page: each live worker listed, one SIGKILLed flagged within 30 s,
a pause logged by the worker, the page's queries bounded.
"""

from __future__ import annotations

import logging
import signal
import time

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.models import QUIET_AFTER_MS, WorkflowWorker
from pikku_django.store.queues import pause_queue, resume_queue
from pikku_django.store.workers import FORGET_QUIET_MS, Beat, beat, forget, quiet_since
from pikku_django.worker import Worker
from pikku_django.worker.beat import BEAT_S, BeatLoop
from tests.support.children import poll_until
from tests.support.workers import WorkerProcessTestCase

URL = "admin:pikku_django_workflowworker_changelist"


def sample(holder: str) -> Beat:
    return Beat(holder=holder, host="h", pid=42, lanes=4, queues="a,b", runs_in_hand=1)


class BeatTests(TransactionTestCase):
    def test_a_beat_writes_the_row_and_reads_the_paused_queues(self) -> None:
        assert beat("default", sample("w1")) == frozenset()
        row = WorkflowWorker.objects.get(holder="w1")
        assert (row.host, row.pid, row.lanes, row.queues, row.runs_in_hand) == ("h", 42, 4, "a,b", 1)
        assert row.started_at > 0 and row.seen_at >= row.started_at
        pause_queue("a")
        assert beat("default", sample("w1")) == frozenset({"a"})
        assert WorkflowWorker.objects.count() == 1
        assert quiet_since("default", "w1") is not None
        assert forget("default", "w1") == 1
        assert quiet_since("default", "w1") is None

    def test_rows_quiet_for_long_are_pruned_by_any_beat(self) -> None:
        beat("default", sample("old"))
        WorkflowWorker.objects.filter(holder="old").update(seen_at=1)
        beat("default", sample("new"))
        assert list(WorkflowWorker.objects.values_list("holder", flat=True)) == ["new"]
        assert FORGET_QUIET_MS > QUIET_AFTER_MS > 2 * BEAT_S * 1000

    def test_the_loop_logs_pause_and_resume_of_its_queues(self) -> None:
        worker = Worker(holder="logs", queues=["a"])
        loop = BeatLoop(worker)
        with self.assertLogs("pikku_django.worker.beat", logging.WARNING) as logs:
            pause_queue("a")
            pause_queue("other")
            loop.poll()
            loop.poll()
            resume_queue("a")
            loop.poll()
        assert logs.output == [
            "WARNING:pikku_django.worker.beat:Queue 'a' is paused: worker logs starts none of its runs.",
            "WARNING:pikku_django.worker.beat:Queue 'a' is resumed: worker logs runs it again.",
        ]
        assert WorkflowWorker.objects.get(holder="logs").queues == "a"


class WorkersPageTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.url = reverse(URL)

    def get(self) -> str:
        response = self.client.get(self.url)
        assert response.status_code == 200
        return response.content.decode()

    def test_the_index_links_to_workers_and_quiet_ones_are_flagged(self) -> None:
        index = self.client.get(reverse("admin:index")).content.decode()
        assert f'href="{self.url}"' in index and ">Workers<" in index
        beat("default", sample("alive"))
        beat("default", sample("killed"))
        seen = WorkflowWorker.objects.get(holder="alive").seen_at
        WorkflowWorker.objects.filter(holder="killed").update(seen_at=seen - 20_000)
        page = self.get()
        assert "alive" in page and "killed" in page
        assert page.count("quiet for") == 1
        assert page.count(">live<") == 1

    def test_the_page_costs_the_same_queries_however_many_workers(self) -> None:
        beat("default", sample("w0"))
        self.get()
        with CaptureQueriesContext(connection) as few:
            self.get()
        for n in range(1, 60):
            beat("default", sample(f"w{n}"))
        with CaptureQueriesContext(connection) as many:
            self.get()
        assert len(many.captured_queries) == len(few.captured_queries)


class WorkerProcessBeatTests(WorkerProcessTestCase):
    def test_two_live_workers_are_listed_and_a_killed_one_is_flagged_within_30_s(self) -> None:
        first = self.worker("--holder", "beat-1")
        second = self.worker("--holder", "beat-2")
        self.ready(first, "beat-1")
        self.ready(second, "beat-2")
        poll_until(lambda: WorkflowWorker.objects.count() == 2, timeout=20)
        second.send_signal(signal.SIGKILL)
        second.wait(10)
        killed = time.monotonic()
        quiet = poll_until(lambda: (quiet_since("default", "beat-2") or 0) > QUIET_AFTER_MS, timeout=30)
        assert quiet and time.monotonic() - killed < 30
        assert (quiet_since("default", "beat-1") or 0) < QUIET_AFTER_MS
        self.stop(first, "beat-1")
        # A worker that stops removes its row.
        assert list(WorkflowWorker.objects.values_list("holder", flat=True)) == ["beat-2"]
