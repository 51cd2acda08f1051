"""
Flow control through a task's options (``pikku_django.tasks.flow``): a
``key`` from a format string of the call's keyword arguments holds the
queue's per-key concurrency; a ``dedup_key`` from a callable returns the
unfinished run's result or raises; debounced calls make one run, ``collect``
receiving every call in order; bad options refused naming them.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from pikku_django.errors import DuplicateRunError, InvalidArgumentError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.queues import key_slot_keys
from pikku_django.tasks import options
from pikku_django.tasks.compat import TaskResultStatus, task
from pikku_django.tasks.flow import task_dedup_key
from pikku_django.worker import Worker
from testproject.testing import flow_tasks
from tests.support.factories import lapse


def plain() -> None:
    """A task function the option tests decorate."""


def drive_all(holder: str = "w-task-flow") -> int:
    """Drive every run due now in this thread; how many passes were made."""
    return Worker(holder=holder, once=True, interval=0.01).run()


def wake(result: Any) -> None:
    """Make a run due later due now (a debounced run's window, without waiting it out)."""
    WorkflowRun.objects.filter(pk=result.id).update(wake_at=0)


@override_settings(PIKKU_QUEUES={"a": {"per_key": {"concurrency": 2}}})
class TaskKeyTests(TransactionTestCase):
    def setUp(self) -> None:
        flow_tasks.calls.clear()

    def test_a_key_from_the_calls_kwargs_holds_per_key_concurrency(self) -> None:
        for i, slot in enumerate(key_slot_keys("a", "tenant:busy", 2)):
            Lease.objects.acquire(slot, f"dead-{i}", 60_000)
        busy = [flow_tasks.per_tenant.enqueue(tenant="busy", n=i) for i in range(3)]
        free = [flow_tasks.per_tenant.enqueue(tenant=f"t{i}", n=i) for i in range(3)]
        keys = {str(pk): key for pk, key in WorkflowRun.objects.values_list("pk", "key")}
        assert [keys[r.id] for r in busy] == ["tenant:busy"] * 3
        assert [keys[r.id] for r in free] == ["tenant:t0", "tenant:t1", "tenant:t2"]
        assert drive_all() == 3
        assert sorted(flow_tasks.calls) == [("t0", 0), ("t1", 1), ("t2", 2)]
        for r in busy:
            r.refresh()
            assert r.status == TaskResultStatus.READY
        # The dead holders' slots lapse: the busy tenant's tasks run, none lost.
        for slot in key_slot_keys("a", "tenant:busy", 2):
            lapse(slot)
        WorkflowRun.objects.filter(pk__in=[r.id for r in busy]).update(wake_at=0)
        assert drive_all("w-task-flow-2") == 3
        for r in busy:
            r.refresh()
            assert r.status == TaskResultStatus.SUCCESSFUL
        assert sorted(flow_tasks.calls)[:3] == [("busy", 0), ("busy", 1), ("busy", 2)]

    def test_a_kwarg_the_key_names_missing_is_refused_naming_the_option(self) -> None:
        with pytest.raises(InvalidArgumentError, match=r"task option key='tenant:\{tenant\}' names 'tenant'"):
            flow_tasks.per_tenant.enqueue(n=1)
        assert not WorkflowRun.objects.exists()


class TaskDedupTests(TransactionTestCase):
    def setUp(self) -> None:
        flow_tasks.calls.clear()

    def test_a_dedup_key_from_a_callable_returns_the_unfinished_runs_result(self) -> None:
        first = flow_tasks.sync_once.enqueue("t1")
        again = flow_tasks.sync_once.enqueue("t1")
        other = flow_tasks.sync_once.enqueue("t2")
        assert again.id == first.id and other.id != first.id
        assert WorkflowRun.objects.count() == 2 and WorkflowStep.objects.count() == 2
        run = WorkflowRun.objects.get(pk=first.id)
        assert run.dedup_key == task_dedup_key(flow_tasks.sync_once.module_path, "sync:t1")
        assert drive_all() == 2
        assert sorted(flow_tasks.calls) == ["t1", "t2"]
        # Freed when its run ends: the next call makes a new run.
        later = flow_tasks.sync_once.enqueue("t1")
        assert later.id != first.id and later.status == TaskResultStatus.READY

    def test_dedup_raise_names_the_unfinished_run(self) -> None:
        first = flow_tasks.sync_or_raise.enqueue(tenant="t1")
        with pytest.raises(DuplicateRunError) as raised:
            flow_tasks.sync_or_raise.enqueue(tenant="t1")
        assert str(raised.value.run_id) == first.id
        # A task's dedup keys are its own: another task with the same text is not held.
        assert flow_tasks.sync_once.enqueue("t1").id != first.id
        assert WorkflowRun.objects.count() == 2


class TaskDebounceTests(TransactionTestCase):
    def setUp(self) -> None:
        flow_tasks.calls.clear()

    def test_debounced_calls_collect_into_one_run_in_order(self) -> None:
        results = [flow_tasks.reindex.enqueue(doc=1, version=v) for v in range(5)]
        other = flow_tasks.reindex.enqueue(doc=2, version=0)
        # Another task debounced on the same key makes its own run.
        last = flow_tasks.reindex_last.enqueue(doc=1, version=9)
        assert {r.id for r in results} == {results[0].id}
        assert len({results[0].id, other.id, last.id}) == 3
        assert WorkflowStep.objects.count() == 3
        for result in (results[0], other, last):
            wake(result)
        assert drive_all() == 3
        assert [{"args": [], "kwargs": {"doc": 1, "version": v}} for v in range(5)] in flow_tasks.calls
        assert [{"args": [], "kwargs": {"doc": 2, "version": 0}}] in flow_tasks.calls
        assert (1, 9) in flow_tasks.calls
        results[0].refresh()
        assert results[0].status == TaskResultStatus.SUCCESSFUL and results[0].return_value == 5

    def test_debounce_last_runs_with_the_last_calls_arguments(self) -> None:
        results = [flow_tasks.reindex_last.enqueue(doc=3, version=v) for v in range(4)]
        assert len({r.id for r in results}) == 1
        wake(results[0])
        assert drive_all() == 1
        assert flow_tasks.calls == [(3, 3)]


class TaskFlowOptionTests(SimpleTestCase):
    def test_bad_flow_options_are_refused_naming_them(self) -> None:
        for given, name in (
            ({"key": ""}, "key"),
            ({"key": "{0}"}, "key"),
            ({"dedup_key": "x{"}, "dedup_key"),
            ({"dedup": "ignore"}, "dedup"),
            ({"key": "k", "debounce_ms": 0}, "debounce_ms"),
            ({"debounce_ms": 1_000}, "debounce_ms needs a key"),
            ({"key": "k", "debounce_ms": 1_000, "debounce_mode": "first"}, "debounce_mode"),
            ({"key": "k", "debounce_max_ms": 1_000}, "debounce_max_ms needs"),
        ):
            with self.subTest(given=given), pytest.raises(InvalidArgumentError, match=name):
                options(**given)(task()(plain))
