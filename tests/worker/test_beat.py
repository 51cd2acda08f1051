"""
The worker's heartbeat (``worker.beat``, ``store.workers``) and the admin's
Workers page: a row written only when what it says changed (an idle
worker commits nothing after its first beat), rows of workers long gone
pruned but never a live one's, each live worker listed and one SIGKILLed
flagged at once (its name's lock gone), a pause logged by the worker, the
page's queries bounded.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.models import WorkflowWorker
from pikku_django.sql.names import NameLock
from pikku_django.store.queues import pause_queue, resume_queue
from pikku_django.store.workers import Beat, beat, forget, live_holders, quiet_since
from pikku_django.worker import Worker
from pikku_django.worker.beat import BEAT_S, BeatLoop
from tests.support.children import poll_until
from tests.support.workers import WorkerProcessTestCase

URL = "admin:pikku_django_workflowworker_changelist"
CHANGE = "admin:pikku_django_workflowworker_change"


def sample(holder: str) -> Beat:
    return Beat(holder=holder, host="h", pid=42, lanes=4, queues="a,b", runs_in_hand=1)


class BeatTests(TransactionTestCase):
    def setUp(self) -> None:
        self.locks: list[NameLock] = []

    def tearDown(self) -> None:
        for lock in self.locks:
            lock.release()

    def hold(self, name: str) -> None:
        lock = NameLock(connection.alias, name)
        self.locks.append(lock)
        assert lock.acquire()

    def test_a_beat_writes_the_row_and_reads_the_paused_queues(self) -> None:
        assert beat("default", sample("w1")) == frozenset()
        row = WorkflowWorker.objects.get(holder="w1")
        assert (row.host, row.pid, row.lanes, row.queues, row.runs_in_hand) == ("h", 42, 4, "a,b", 1)
        assert row.started_at > 0 and row.seen_at >= row.started_at
        pause_queue("a")
        assert beat("default", sample("w1"), sample("w1")) == frozenset({"a"})
        assert WorkflowWorker.objects.count() == 1
        # Its name not held, the row is of a worker gone quiet; held, of a live one.
        assert quiet_since("default", "w1") is not None
        self.hold("w1")
        assert quiet_since("default", "w1") == 0
        assert forget("default", "w1") == 1
        assert quiet_since("default", "w1") is None

    def test_a_beat_writes_only_what_changed_and_commits_nothing_else(self) -> None:
        beat("default", sample("w1"))
        rows = WorkflowWorker.objects.filter(holder="w1")
        # Set back, so that any write shows.
        rows.update(seen_at=1, started_at=1)
        with CaptureQueriesContext(connection) as queries:
            beat("default", sample("w1"), sample("w1"))
        assert rows.get().seen_at == 1
        sent = [query["sql"].lstrip().split()[0].upper() for query in queries.captured_queries]
        assert sent == ["SELECT", "SELECT"], queries.captured_queries
        busier = Beat(holder="w1", host="h", pid=42, lanes=4, queues="a,b", runs_in_hand=3)
        beat("default", busier, sample("w1"))
        row = rows.get()
        assert row.runs_in_hand == 3 and row.seen_at > 1 and row.started_at == 1
        # A process's first beat starts its row afresh; a row gone missing is made again.
        beat("default", busier)
        assert rows.get().started_at > 1
        rows.delete()
        beat("default", busier, busier)
        assert rows.get().runs_in_hand == 3

    def test_rows_long_gone_are_pruned_unless_their_worker_holds_its_name(self) -> None:
        for holder in ("old", "idle-for-hours", "recent"):
            beat("default", sample(holder))
        self.hold("idle-for-hours")
        WorkflowWorker.objects.filter(holder__in=["old", "idle-for-hours"]).update(seen_at=1)
        beat("default", sample("new"))
        assert list(WorkflowWorker.objects.values_list("holder", flat=True)) == [
            "idle-for-hours",
            "new",
            "recent",
        ]

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
        assert loop.written is not None and loop.written.holder == "logs"


class WorkersPageTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.url = reverse(URL)
        self.lock = NameLock(connection.alias, "alive")
        assert self.lock.acquire()

    def tearDown(self) -> None:
        self.lock.release()

    def get(self, url: str | None = None) -> str:
        response = self.client.get(url or self.url)
        assert response.status_code == 200
        return response.content.decode()

    def test_the_index_links_to_workers_and_ones_gone_quiet_are_flagged(self) -> None:
        index = self.client.get(reverse("admin:index")).content.decode()
        assert f'href="{self.url}"' in index and ">Workers<" in index
        beat("default", sample("alive"))
        beat("default", sample("killed"))
        page = self.get()
        assert "alive" in page and "killed" in page
        assert page.count("gone quiet: stopped without saying so") == 1
        assert page.count(">live<") == 1
        assert page.count("row last written") == 1 and page.count(">now<") == 1
        # A row's own page judges it alike.
        killed = WorkflowWorker.objects.get(holder="killed")
        alive = WorkflowWorker.objects.get(holder="alive")
        assert "gone quiet" in self.get(reverse(CHANGE, args=[killed.pk]))
        assert ">live<" in self.get(reverse(CHANGE, args=[alive.pk]))

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


def row_versions() -> list[Any]:
    """Every worker row as it is now; on PostgreSQL with its tuple's ``xmin``, which any write changes."""
    rows: list[Any] = list(WorkflowWorker.objects.order_by("holder").values())
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT holder, xmin::text FROM pikku_workflow_worker ORDER BY holder")
            rows.extend(cursor.fetchall())
    return rows


class WorkerProcessBeatTests(WorkerProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))

    def page(self) -> str:
        response = self.client.get(reverse(URL))
        assert response.status_code == 200
        return response.content.decode()

    def logged(self, proc: subprocess.Popen[str], line: str) -> bool:
        return line in self.log(proc)

    def test_an_idle_worker_commits_nothing_after_its_first_beat(self) -> None:
        # A queue paused before the start and resumed after: each beat shows in the log.
        pause_queue("idle-q")
        proc = self.worker("--holder", "idle-beat")
        self.ready(proc, "idle-beat")
        poll_until(lambda: self.logged(proc, "Queue 'idle-q' is paused"), timeout=10)
        written = row_versions()
        assert [row["holder"] for row in written[:1]] == ["idle-beat"]
        resume_queue("idle-q")
        poll_until(lambda: self.logged(proc, "Queue 'idle-q' is resumed"), timeout=BEAT_S + 3)
        # A beat went by since the row was written, and wrote nothing.
        assert row_versions() == written
        page = self.page()
        assert ">live<" in page and "now (idle)" in page and "gone quiet" not in page
        self.stop(proc, "idle-beat")
        assert not WorkflowWorker.objects.exists()

    def test_a_sigkilled_worker_is_flagged_at_once_and_a_live_one_is_not(self) -> None:
        first = self.worker("--holder", "beat-1")
        second = self.worker("--holder", "beat-2")
        self.ready(first, "beat-1")
        self.ready(second, "beat-2")
        poll_until(lambda: WorkflowWorker.objects.count() == 2, timeout=10)
        assert self.page().count(">live<") == 2
        assert live_holders("default", ["beat-1", "beat-2"]) == {"beat-1", "beat-2"}
        second.send_signal(signal.SIGKILL)
        second.wait(10)
        killed = time.monotonic()
        poll_until(lambda: "gone quiet" in self.page(), timeout=5)
        assert time.monotonic() - killed < 5
        page = self.page()
        assert page.count("gone quiet") == 1 and page.count(">live<") == 1
        assert quiet_since("default", "beat-1") == 0
        assert (quiet_since("default", "beat-2") or 0) > 0
        self.stop(first, "beat-1")
        # A worker that stops removes its row.
        assert list(WorkflowWorker.objects.values_list("holder", flat=True)) == ["beat-2"]
