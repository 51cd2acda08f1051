"""
Per-key concurrency (``PIKKU_QUEUES[q]["per_key"]["concurrency"]``): a run
with a ``key`` is driven only under one of its key's slot leases, so at most
that many runs of one key are driven at once across every worker; a dead
holder's slot frees itself when its lease lapses; a run whose key is full
waits a little and the other keys' runs go first.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict

import pytest
from django.db import connection
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext

from pikku_django.checks import QUEUES_CHECK_ID, check_queues
from pikku_django.models import Lease, WorkflowRun
from pikku_django.queues import KEY_WAIT_MS, key_slot_keys, run_slots
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until, subprocess_env
from tests.support.factories import lapse
from tests.support.workers import WorkerProcessTestCase

PER_KEY = {"sync": {"per_key": {"concurrency": 2}}}


@override_settings(PIKKU_QUEUES=PER_KEY)
class KeySlotTests(TransactionTestCase):
    def test_key_slots_are_leases_of_their_own_per_key(self) -> None:
        keys = key_slot_keys("sync", "tenant:1", 2)
        assert len(keys) == 2 and all(k.startswith("queue:sync:key:") for k in keys)
        assert key_slot_keys("sync", "tenant:2", 2) != keys
        assert all(len(k) <= 255 for k in key_slot_keys("q" * 100, "k" * 255, 1000))

    def test_a_third_run_of_a_key_waits_while_two_hold_its_slots(self) -> None:
        runs = [start_workflow("test.steps", {"steps": 1}, queue="sync", key="t1") for _ in range(3)]
        other = start_workflow("test.steps", {"steps": 1}, queue="sync", key="t2")
        wake = {r.pk: WorkflowRun.objects.get(pk=r.pk).wake_at for r in [*runs, other]}
        with (
            run_slots("sync", runs[0].pk, wake[runs[0].pk], "w1") as one,
            run_slots("sync", runs[1].pk, wake[runs[1].pk], "w2") as two,
        ):
            assert one is True and two is True
            before = Lease.objects.db_now_ms()
            with run_slots("sync", runs[2].pk, wake[runs[2].pk], "w3") as three:
                assert three is False
            # It waits a little, behind the other keys' due runs.
            wake_at = WorkflowRun.objects.get(pk=runs[2].pk).wake_at
            assert before + KEY_WAIT_MS <= wake_at <= Lease.objects.db_now_ms() + KEY_WAIT_MS
            with run_slots("sync", other.pk, wake[other.pk], "w3") as free:
                assert free is True
        # Freed on exit.
        assert [Lease.objects.current(k) for k in key_slot_keys("sync", "t1", 2)] == [None, None]

    def test_a_run_without_a_key_or_on_another_queue_needs_no_key_slot(self) -> None:
        plain = start_workflow("test.steps", {"steps": 1}, queue="sync")
        elsewhere = start_workflow("test.steps", {"steps": 1}, key="t1")
        for run in (plain, elsewhere):
            with run_slots(run.queue, run.pk, run.wake_at, "w") as slot:
                assert slot is True
        assert not Lease.objects.filter(key__contains=":key:").exists()

    def test_a_worker_drives_other_keys_while_one_key_is_full_and_its_dead_slots_lapse(self) -> None:
        for i, slot in enumerate(key_slot_keys("sync", "busy", 2)):
            Lease.objects.acquire(slot, f"dead-{i}", 60_000)
        busy = [start_workflow("test.steps", {"steps": 1}, queue="sync", key="busy") for _ in range(3)]
        free = [start_workflow("test.steps", {"steps": 1}, queue="sync", key=f"t{i}") for i in range(3)]
        assert Worker(holder="w", once=True).run() == 3
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert [statuses[r.pk] for r in free] == ["completed"] * 3
        assert [statuses[r.pk] for r in busy] == ["running"] * 3
        # The dead holders' slots lapse: the key's runs are driven, none lost.
        for slot in key_slot_keys("sync", "busy", 2):
            lapse(slot)
        WorkflowRun.objects.filter(pk__in=[r.pk for r in busy]).update(wake_at=0)
        assert Worker(holder="w2", once=True).run() == 3
        assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"completed"}

    def test_a_child_run_takes_the_key_its_parent_gives_it(self) -> None:
        run = start_workflow("test.keyed_parent", {"key": "child:1", "value": 4}, queue="sync", key="p")
        Worker(holder="w", once=True).run()
        child = WorkflowRun.objects.get(parent=run)
        assert (child.key, child.queue, child.status) == ("child:1", "sync", "completed")
        assert WorkflowRun.objects.get(pk=run.pk).output == 8


class PerKeyCheckTests(SimpleTestCase):
    databases = {"default"}

    def test_good_entries_pass(self) -> None:
        for good in [PER_KEY, {"a": {}}, {"a": {"concurrency": 3, "per_key": {"concurrency": 1}}}]:
            with override_settings(PIKKU_QUEUES=good):
                assert check_queues() == [], good

    def test_bad_entries_name_the_setting_key(self) -> None:
        for bad, named in [
            ({"a": {"per_key": 2}}, "PIKKU_QUEUES['a']['per_key']"),
            ({"a": {"per_key": {}}}, "PIKKU_QUEUES['a']['per_key']"),
            ({"a": {"per_key": {"concurrency": 0}}}, "PIKKU_QUEUES['a']['per_key']['concurrency']"),
            ({"a": {"per_key": {"concurrency": True}}}, "PIKKU_QUEUES['a']['per_key']['concurrency']"),
            ({"a": {"per_key": {"concurrency": 1, "x": 1}}}, "PIKKU_QUEUES['a']['per_key']"),
            ({"a": {"limit": 1}}, "PIKKU_QUEUES['a']"),
        ]:
            with override_settings(PIKKU_QUEUES=bad):
                errors = check_queues()
            assert [e.id for e in errors] == [QUEUES_CHECK_ID], bad
            assert named in errors[0].msg, errors[0].msg


@pytest.mark.slow
class PerKeyProcessTests(WorkerProcessTestCase):
    def test_a_sigkilled_workers_key_slot_frees_itself_within_its_lease(self) -> None:
        ttl_ms = 1500
        blocked = start_workflow("test.blocker", {"lease_ms": ttl_ms}, queue="sync", key="k")
        env = subprocess_env(
            PIKKU_QUEUES=json.dumps({"sync": {"per_key": {"concurrency": 1}}}),
            PIKKU_LEASE_TTL_MS=str(ttl_ms),
            PIKKU_STEP_LEASE_MS=str(ttl_ms),
        )
        first = self.worker("--holder", "a", "--interval", "0.05", env=env)
        self.ready(first, "a")
        poll_until(lambda: StepCall.objects.filter(run_id=blocked.pk, step="block").exists(), timeout=60)
        waiting = start_workflow("test.steps", {"steps": 1}, queue="sync", key="k")
        slot = key_slot_keys("sync", "k", 1)[0]
        assert Lease.objects.current(slot).holder.startswith("a")
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        killed_at = Lease.objects.db_now_ms()
        # Nobody renews it now: it lapses within its lease.
        assert Lease.objects.get(key=slot).expires_at <= killed_at + ttl_ms
        second = self.worker("--holder", "b", "--interval", "0.05", env=env)
        self.ready(second, "b")
        done = WorkflowRun.objects.filter(status="completed")
        poll_until(lambda: done.filter(pk=waiting.pk).exists(), timeout=60, interval=0.05)
        (started,) = StepCall.objects.filter(run_id=waiting.pk).values_list("at_ms", flat=True)
        assert started > killed_at
        # The blocked run is driven again too, under the key's one slot.
        poll_until(lambda: done.filter(pk=blocked.pk).exists(), timeout=60, interval=0.05)
        second.terminate()
        assert second.wait(timeout=60) == 0, self.log(second)

    def test_three_workers_of_four_lanes_never_run_more_than_two_runs_of_a_key(self) -> None:
        step_ms = 60
        runs = {
            start_workflow(
                "test.slow_steps", {"steps": 1, "ms": step_ms}, queue="sync", key=f"tenant:{i % 4}"
            ).pk: f"tenant:{i % 4}"
            for i in range(48)
        }
        env = subprocess_env(PIKKU_QUEUES=json.dumps(PER_KEY))
        workers = [
            self.worker("--holder", f"w{n}", "--concurrency", "4", "--interval", "0.05", env=env)
            for n in range(3)
        ]
        for n, proc in enumerate(workers):
            self.ready(proc, f"w{n}")
        done = WorkflowRun.objects.filter(status="completed")
        poll_until(lambda: done.count() == len(runs), timeout=90, interval=0.1)
        starts: dict[str, list[int]] = defaultdict(list)
        for run_id, at_ms in StepCall.objects.values_list("run_id", "at_ms"):
            starts[runs[run_id]].append(at_ms)
        for key, times in starts.items():
            # Each step runs at least step_ms from its start: a third start
            # while two started less than step_ms before it is a third run at once.
            times.sort()
            overlaps = [times[i + 2] - times[i] for i in range(len(times) - 2)]
            assert min(overlaps) >= step_ms - 5, (key, times)
        assert sum(len(times) for times in starts.values()) == len(runs)
        for proc in workers:
            proc.terminate()
        for proc in workers:
            assert proc.wait(timeout=60) == 0, self.log(proc)


class HotPathTests(TransactionTestCase):
    def drive_one(self, holder: str) -> int:
        """The statements a worker sends to drive one due run of the default queue."""
        start_workflow("test.double", 2)
        with CaptureQueriesContext(connection) as queries:
            assert Worker(holder=holder, once=True).run() == 1
        return len(queries)

    def test_per_key_limits_on_another_queue_cost_a_default_run_no_statement(self) -> None:
        self.drive_one("warm")
        plain = self.drive_one("plain")
        with override_settings(PIKKU_QUEUES=PER_KEY):
            limited_elsewhere = self.drive_one("limited")
        assert limited_elsewhere == plain
