"""
Queues and priorities of runs, PIKKU_QUEUES slot leases, the worker's queue
filter, and the holder each claim writes on its attempt.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import SimpleTestCase, TestCase, TransactionTestCase, override_settings
from django.urls import reverse

from pikku_django.checks import QUEUES_CHECK_ID, check_queues
from pikku_django.errors import InvalidArgumentError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.queues import queue_slot, slot_keys
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.factories import lapse, lapse_step, make_step


def order_of_calls() -> list[str]:
    return list(StepCall.objects.order_by("at_ms", "pk").values_list("run_id", flat=True))


class QueueAndPriorityTests(TransactionTestCase):
    def test_start_workflow_stores_queue_and_priority(self) -> None:
        run = start_workflow("test.steps", {"steps": 1}, queue="emails", priority=5)
        run.refresh_from_db()
        assert (run.queue, run.priority) == ("emails", 5)
        plain = start_workflow("test.steps", {"steps": 1})
        assert (plain.queue, plain.priority) == ("default", 0)

    def test_bad_queue_or_priority_is_refused_before_any_sql(self) -> None:
        for kwargs, argument in [
            ({"queue": ""}, "queue"),
            ({"queue": "q" * 101}, "queue"),
            ({"queue": 3}, "queue"),
            ({"priority": "high"}, "priority"),
            ({"priority": True}, "priority"),
            ({"priority": 2**31}, "priority"),
        ]:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match=argument):
                start_workflow("test.steps", None, **kwargs)
        with pytest.raises(TypeError):
            start_workflow("test.steps", None, "emails")  # type: ignore[misc]

    def test_worker_takes_higher_priorities_first_then_earlier_wake_at(self) -> None:
        runs = {p: start_workflow("test.steps", {"steps": 1}, priority=p) for p in [0, 5, -3, 10, 5]}
        # Distinct wake_at values (two starts can share a millisecond), all due.
        now = Lease.objects.db_now_ms()
        for offset, run in enumerate(WorkflowRun.objects.order_by("created_at", "pk")):
            WorkflowRun.objects.filter(pk=run.pk).update(wake_at=now - 1000 + offset)
        worker = Worker(holder="w", once=True, batch=2)
        due = [row[0] for row in worker.due()]
        expected = sorted(WorkflowRun.objects.all(), key=lambda r: (-r.priority, r.wake_at, 0))
        assert due == [r.pk for r in expected[:2]]
        assert due[0] == runs[10].pk
        worker.run()
        ran = [WorkflowRun.objects.get(pk=pk).priority for pk in order_of_calls()]
        assert ran == [10, 5, 5, 0, -3]

    def test_next_due_merges_running_and_suspended_runs_in_one_order(self) -> None:
        low, high, waiting, later = (start_workflow("test.steps", priority=p) for p in (1, 5, 3, 9))
        now = Lease.objects.db_now_ms()
        # A suspended run whose wait timed out is due; one whose wait has not is not.
        WorkflowRun.objects.filter(pk=waiting.pk).update(status="suspended", wake_at=now - 10)
        WorkflowRun.objects.filter(pk=later.pk).update(status="suspended", wake_at=now + 60_000)
        due = WorkflowRun.objects.get_queryset().next_due(10)
        assert [row[0] for row in due] == [high.pk, waiting.pk, low.pk]
        assert [row[0] for row in WorkflowRun.objects.get_queryset().next_due(2)] == [high.pk, waiting.pk]
        assert due[1] == (waiting.pk, now - 10, "default")

    def test_worker_with_queues_never_takes_another_queue(self) -> None:
        a = [start_workflow("test.steps", {"steps": 1}, queue="a") for _ in range(3)]
        b = [start_workflow("test.steps", {"steps": 1}, queue="b", priority=50) for _ in range(3)]
        assert Worker(holder="wa", once=True, queues=["a"]).run() == 3
        assert {r.status for r in WorkflowRun.objects.filter(pk__in=[r.pk for r in a])} == {"completed"}
        assert {r.status for r in WorkflowRun.objects.filter(pk__in=[r.pk for r in b])} == {"running"}
        assert Worker(holder="wab", once=True, queues=["c", "b"]).run() == 3

    def test_queue_option_is_repeatable_and_comma_separated(self) -> None:
        start_workflow("test.steps", {"steps": 1}, queue="x")
        start_workflow("test.steps", {"steps": 1}, queue="y")
        start_workflow("test.steps", {"steps": 1}, queue="z")
        call_command("pikku_worker", "--once", "--queue", "x,y", "--queue", "q", verbosity=0)
        assert sorted(WorkflowRun.objects.filter(status="running").values_list("queue", flat=True)) == ["z"]
        with pytest.raises(CommandError, match="queue"):
            call_command("pikku_worker", "--once", "--queue", "a,,b", verbosity=0)


@override_settings(PIKKU_QUEUES={"slow": {"concurrency": 2}})
class SlotTests(TransactionTestCase):
    def test_slots_are_leases_taken_in_turn_and_freed_on_exit(self) -> None:
        assert slot_keys("slow", 2) == ["queue:slow:0", "queue:slow:1"]
        with queue_slot("slow", "w1") as one, queue_slot("slow", "w2") as two:
            assert one and two
            assert {Lease.objects.current(k).holder for k in slot_keys("slow", 2)} == {"w1", "w2"}
            with queue_slot("slow", "w3") as three:
                assert three is False
            # An unlimited queue has no slots.
            with queue_slot("fast", "w3") as fast:
                assert fast is True
            assert not Lease.objects.filter(key__startswith="queue:fast").exists()
        assert [Lease.objects.current(k) for k in slot_keys("slow", 2)] == [None, None]

    def test_a_dead_holders_slot_frees_when_its_lease_lapses(self) -> None:
        # Two slots held by workers that will never release them.
        for i, key in enumerate(slot_keys("slow", 2)):
            Lease.objects.acquire(key, f"dead-{i}", 60_000)
        with queue_slot("slow", "w") as slot:
            assert slot is False
        lapse("queue:slow:1")
        with queue_slot("slow", "w") as slot:
            assert slot is True
            assert Lease.objects.current("queue:slow:1").holder == "w"

    def test_a_worker_finding_a_queue_full_moves_on_to_other_queues(self) -> None:
        for i, key in enumerate(slot_keys("slow", 2)):
            Lease.objects.acquire(key, f"other-{i}", 60_000)
        # Slow runs first in the order, and more of them than a batch.
        slow = [start_workflow("test.steps", {"steps": 1}, queue="slow", priority=9) for _ in range(4)]
        fast = [start_workflow("test.steps", {"steps": 1}, queue="fast") for _ in range(2)]
        worker = Worker(holder="w", once=True, batch=3)
        looks: list[set[str]] = []
        due = worker.due

        def counted_due(exclude: Any = ()) -> Any:
            looks.append(set(exclude))
            return due(exclude)

        worker.due = counted_due  # type: ignore[method-assign]
        took = worker.run_batch()
        # The first look found only slow runs, and slow full: every later look
        # (one before each pass, and one that found nothing) leaves it out.
        assert looks == [set(), {"slow"}, {"slow"}, {"slow"}]
        assert took == 2
        assert set(
            WorkflowRun.objects.filter(pk__in=[r.pk for r in fast]).values_list("status", flat=True)
        ) == {"completed"}
        assert set(
            WorkflowRun.objects.filter(pk__in=[r.pk for r in slow]).values_list("status", flat=True)
        ) == {"running"}
        # Nothing else due: the worker waits for its interval, it does not spin.
        looks.clear()
        assert worker.run_batch() == 0
        assert looks == [set(), {"slow"}]
        # A slot frees: the worker drives slow runs again, under the slot.
        lapse("queue:slow:0")
        assert worker.run_batch() == 3
        assert WorkflowRun.objects.filter(queue="slow", status="completed").count() == 3


class HolderTests(TransactionTestCase):
    def test_the_claim_writes_its_holder_on_the_attempt(self) -> None:
        step = make_step()
        claimed = WorkflowStep.objects.claim(step.run_id, step.step_name, step.rpc_name, 60_000, holder="w-1")
        assert claimed is not None
        lapse_step(step)
        again = WorkflowStep.objects.claim(step.run_id, step.step_name, step.rpc_name, 60_000, holder="w-2")
        assert again is not None and again.attempt == 2
        rows = WorkflowStepAttempt.objects.filter(step=step).order_by("attempt")
        assert [(a.attempt, a.holder) for a in rows] == [(1, "w-1"), (2, "w-2")]
        with pytest.raises(InvalidArgumentError, match="holder"):
            WorkflowStep.objects.claim(step.run_id, step.step_name, step.rpc_name, 60_000, holder="")

    def test_a_worker_pass_records_its_holder(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        Worker(holder="named-worker", once=True).run()
        holders = WorkflowStepAttempt.objects.filter(step__run=run).values_list("holder", flat=True)
        assert list(holders) == ["named-worker", "named-worker"]


class QueuesCheckTests(SimpleTestCase):
    databases = {"default"}

    def test_good_and_absent_values_pass(self) -> None:
        assert check_queues() == []
        with override_settings(PIKKU_QUEUES={"emails": {"concurrency": 2}, "x": {"concurrency": 1}}):
            assert check_queues() == []

    def test_bad_values_are_errors(self) -> None:
        for bad in [
            [],
            {"emails": 2},
            {"emails": {"concurrency": 0}},
            {"emails": {"concurrency": True}},
            {"emails": {"concurrency": "2"}},
            {"emails": {"concurrency": 2, "extra": 1}},
            {"": {"concurrency": 1}},
            {"q" * 101: {"concurrency": 1}},
        ]:
            with override_settings(PIKKU_QUEUES=bad):
                errors = check_queues()
            assert [e.id for e in errors] == [QUEUES_CHECK_ID], bad
            assert "PIKKU_QUEUES" in errors[0].msg and errors[0].hint
        assert QUEUES_CHECK_ID == "pikku_django.E007"


class AdminShowsQueuesAndHoldersTests(TestCase):
    def setUp(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)

    def test_runs_show_queue_and_priority_and_attempts_show_their_worker(self) -> None:
        run = WorkflowRun.objects.create_run("order", queue="emails-queue", priority=42)
        step = WorkflowStep.objects.insert_step(run, "charge", "shop.charge")
        assert WorkflowStep.objects.claim(run.pk, "charge", "shop.charge", 60_000, holder="host-9:123:abcd")
        page = self.client.get(reverse("admin:pikku_django_workflowrun_changelist"))
        assert page.status_code == 200
        assert "emails-queue" in page.content.decode() and ">42<" in page.content.decode()
        page = self.client.get(reverse("admin:pikku_django_workflowstep_change", args=[step.pk]))
        assert page.status_code == 200
        assert "host-9:123:abcd" in page.content.decode()
