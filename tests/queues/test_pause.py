"""
Pausing, resuming and draining a queue (``WorkflowQueue.paused``): the due
look leaves a paused queue out and the take is guarded on it, so no pass of
the queue starts once the pause commits, while other queues go on.
"""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import connections
from django.test import TransactionTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import Lease, WorkflowQueue, WorkflowRun
from pikku_django.store.queues import drain_queue, pause_queue, resume_queue, set_paused, sync_queues
from pikku_django.store.takes import take_run
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until


def statuses(queue: str) -> list[str]:
    return sorted(WorkflowRun.objects.filter(queue=queue).values_list("status", flat=True))


class PauseTests(TransactionTestCase):
    def test_a_paused_queue_is_left_out_and_resumes(self) -> None:
        for queue in ["a", "a", "b"]:
            start_workflow("test.steps", {"steps": 1}, queue=queue)
        assert pause_queue("a") is True
        assert pause_queue("a") is False
        assert WorkflowQueue.objects.get(name="a").paused
        worker = Worker(holder="w", once=True)
        assert {queue for _, _, queue in worker.due()} == {"b"}
        assert worker.run() == 1
        assert statuses("b") == ["completed"]
        assert statuses("a") == ["running", "running"]
        assert not StepCall.objects.filter(run_id__in=WorkflowRun.objects.filter(queue="a").values("pk"))
        assert resume_queue("a") is True
        assert resume_queue("a") is False
        assert Worker(holder="w", once=True).run() == 2
        assert statuses("a") == ["completed", "completed"]

    def test_the_take_itself_refuses_a_run_read_before_the_pause_committed(self) -> None:
        run = start_workflow("test.steps", {"steps": 1}, queue="late")
        worker = Worker(holder="w", once=True)
        ((run_id, wake_at, _),) = worker.due()
        # The look read the run; the pause commits before the take.
        pause_queue("late")
        take = take_run("default", run_id, wake_at, "w", 5000, 100)
        assert not take.taken
        assert not Lease.objects.filter(key=run.lease_key).exists()
        resume_queue("late")
        assert take_run("default", run_id, wake_at, "w", 5000, 100).taken

    def test_a_queue_paused_while_a_worker_runs_starts_nothing_more(self) -> None:
        worker = Worker(holder="threads", interval=0.05, concurrency=2)

        def run() -> None:
            try:
                worker.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            first = start_workflow("test.steps", {"steps": 1}, queue="p")
            poll_until(lambda: WorkflowRun.objects.get(pk=first.pk).status == "completed", timeout=20)
            pause_queue("p")
            paused = [start_workflow("test.steps", {"steps": 1}, queue="p") for _ in range(3)]
            other = [start_workflow("test.steps", {"steps": 1}, queue="q") for _ in range(3)]
            poll_until(lambda: statuses("q") == ["completed"] * 3, timeout=20)
            # The worker has looked more than once since: the paused queue's runs never started.
            assert not StepCall.objects.filter(run_id__in=[str(run.pk) for run in paused]).exists()
            assert statuses("p") == ["completed", "running", "running", "running"]
            resume_queue("p")
            poll_until(lambda: statuses("p") == ["completed"] * 4, timeout=20)
            assert other
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()

    def test_bad_names_are_refused_before_any_sql(self) -> None:
        for bad in ["", "q" * 101, 3]:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="name"):
                set_paused(bad, True)  # type: ignore[arg-type]
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="name"):
                drain_queue(bad)  # type: ignore[arg-type]

    def test_pause_and_resume_are_logged(self) -> None:
        with self.assertLogs("pikku_django.store.queues", logging.INFO) as logs:
            pause_queue("logged")
            resume_queue("logged")
        assert logs.output == [
            "INFO:pikku_django.store.queues:Queue 'logged' paused.",
            "INFO:pikku_django.store.queues:Queue 'logged' resumed.",
        ]


class DrainAndSyncTests(TransactionTestCase):
    def test_drain_cancels_the_due_runs_of_its_queue_in_batches(self) -> None:
        due = [start_workflow("test.steps", {"steps": 1}, queue="d") for _ in range(5)]
        later = start_workflow("test.steps", {"steps": 1}, queue="d")
        now = Lease.objects.db_now_ms()
        WorkflowRun.objects.filter(pk=later.pk).update(wake_at=now + 3_600_000)
        kept = start_workflow("test.steps", {"steps": 1}, queue="other")
        assert drain_queue("d", batch_size=2) == 5
        assert set(
            WorkflowRun.objects.filter(pk__in=[r.pk for r in due]).values_list("status", flat=True)
        ) == {"cancelled"}
        assert WorkflowRun.objects.get(pk=later.pk).status == "running"
        assert WorkflowRun.objects.get(pk=kept.pk).status == "running"
        assert drain_queue("d") == 0

    def test_sync_makes_a_row_for_each_queue_with_runs_or_configured(self) -> None:
        start_workflow("test.steps", {"steps": 1}, queue="has-runs")
        with self.settings(PIKKU_QUEUES={"configured": {"concurrency": 1}}):
            assert sync_queues() == 2
            assert sync_queues() == 0
        assert sorted(WorkflowQueue.objects.values_list("name", flat=True)) == ["configured", "has-runs"]
