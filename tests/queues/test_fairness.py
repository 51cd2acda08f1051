"""
Fairness among the keys of a queue with ``per_key`` (``store.fairness``):
the key served longest ago goes first, so a tenant with 1,000 due runs
delays another tenant's runs by at most one take per lane; each take gives
its key the queue's next turn; a queue without ``per_key`` keeps its look.
"""

from __future__ import annotations

from django.test import TransactionTestCase, override_settings

from pikku_django.models import FlowKey, WorkflowRun
from pikku_django.store.fairness import NO_KEY, fair_due, served
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from tests.support.children import poll_until

PER_KEY = {"sync": {"per_key": {"concurrency": 2}}}


def start_many(key: str | None, count: int, queue: str = "sync") -> list[WorkflowRun]:
    """``count`` due runs of one key: one started, the rest its copies due at the same instant."""
    first = start_workflow("test.echo_input", {"i": 0}, queue=queue, key=key)
    first.refresh_from_db()
    copied = ("workflow", "code_version", "driven_version", "queue", "status", "wake_at", "key", "created_at")
    fields = {name: getattr(first, name) for name in copied}
    rest = [WorkflowRun(**fields, input={"i": i}, updated_at=first.created_at) for i in range(1, count)]
    return [first, *WorkflowRun.objects.bulk_create(rest)]


def completed(key: str) -> int:
    return WorkflowRun.objects.filter(key=key, status="completed").count()


@override_settings(PIKKU_QUEUES=PER_KEY)
class FairnessTests(TransactionTestCase):
    def test_a_small_tenant_is_not_starved_by_a_big_one(self) -> None:
        start_many("big", 1_000)
        start_many("small", 10)
        worker = Worker(holder="w-fair", once=True, concurrency=1)

        def small_done() -> bool:
            assert worker.drive_next()
            return completed("small") == 10

        poll_until(small_done, 15, interval=0)
        # One lane: each of the small tenant's runs waits for at most one of the big
        # tenant's takes, so all ten are done before the big tenant's twelfth.
        assert completed("big") <= 11
        assert WorkflowRun.objects.filter(key="big", status="running").count() >= 989

    def test_each_take_gives_its_key_the_queues_next_turn(self) -> None:
        assert [served("default", "sync", k) for k in ("a", "b", None, "a")] == [1, 2, 3, 4]
        turns = dict(FlowKey.objects.filter(queue="sync").values_list("key", "served"))
        assert turns == {"a": 4, "b": 2, NO_KEY: 3}
        # Another queue counts its own turns.
        assert served("default", "other", "a") == 1

    def test_the_look_orders_a_per_key_queues_runs_by_their_keys_turn(self) -> None:
        a = start_many("a", 2)
        b = start_many("b", 2)
        plain = start_many(None, 1, queue="default")
        served("default", "sync", "a")
        look = [(r.pk, r.wake_at, r.queue) for r in (*a, *b, *plain)]
        fair = fair_due("default", look)
        # The queue's runs in fair order, place by place (b never served: first); the other queue's kept.
        assert [{row[0] for row in pair} for pair in (fair[:2], fair[2:4])] == [
            {r.pk for r in b},
            {r.pk for r in a},
        ]
        assert fair[4] == look[4]

    @override_settings(PIKKU_QUEUES={"sync": {"concurrency": 5}})
    def test_a_queue_without_per_key_keeps_its_look(self) -> None:
        runs = start_many("a", 2)
        look = [(r.pk, r.wake_at, r.queue) for r in runs]
        assert fair_due("default", look) is look
