"""
Debounced starts (``start_workflow(..., key=, debounce_ms=)``): starts of one
key within ``debounce_ms`` of each other make one run, due ``debounce_ms``
after the last and never later than ``debounce_max_ms`` after the first,
with the last input or every input in order; racing starts in several OS
processes make one run.
"""

from __future__ import annotations

import pytest
from django.test import TestCase, TransactionTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import Lease, WorkflowRun
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from tests.support.children import finish, poll_until, read_line, send_line, start_script

#: Waits for "go", then makes ``starts`` debounced starts (collect) of key ``doc``.
START_DEBOUNCED = """
import sys
import django
django.setup()
from pikku_django.workflows import start_workflow

tag, starts = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
for i in range(starts):
    run = start_workflow("test.echo_input", f"{tag}-{i}", key="doc", debounce_ms=60_000,
                         debounce_mode="collect")
    print(run.pk, flush=True)
"""


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def debounced(value: object, **kwargs: object) -> WorkflowRun:
    options: dict[str, object] = {"key": "doc:1", "debounce_ms": 5_000, **kwargs}
    return start_workflow("test.echo_input", value, **options)  # type: ignore[arg-type]


class DebounceTests(TestCase):
    def test_starts_within_the_window_make_one_run_with_the_last_input(self) -> None:
        first = debounced(1)
        runs = [debounced(i) for i in range(2, 6)]
        assert {r.pk for r in runs} == {first.pk}
        run = WorkflowRun.objects.get()
        assert run.input == 5
        # Due debounce_ms after the last start.
        assert now_ms() + 4_000 < run.wake_at <= now_ms() + 5_000

    def test_collect_gets_every_input_in_order(self) -> None:
        for i in range(100):
            debounced({"i": i}, debounce_mode="collect")
        assert WorkflowRun.objects.get().input == [{"i": i} for i in range(100)]

    def test_never_later_than_the_max_after_the_first(self) -> None:
        before = now_ms()
        first = debounced(1, debounce_ms=60_000, debounce_max_ms=1_000)
        assert first.wake_at <= now_ms() + 1_000
        again = debounced(2, debounce_ms=60_000, debounce_max_ms=1_000)
        assert again.pk == first.pk
        assert before + 1_000 <= WorkflowRun.objects.get().wake_at <= first.debounce_until
        assert first.debounce_until <= now_ms() + 1_000

    def test_keys_and_workflows_debounce_apart(self) -> None:
        a = debounced(1)
        b = debounced(1, key="doc:2")
        c = start_workflow("test.double", 1, key="doc:1", debounce_ms=5_000)
        assert len({a.pk, b.pk, c.pk}) == 3

    def test_a_run_due_or_taken_closes_its_burst(self) -> None:
        first = debounced(1)
        WorkflowRun.objects.filter(pk=first.pk).update(wake_at=now_ms() - 1)
        second = debounced(2)
        assert second.pk != first.pk
        # Taken by a worker: its run lease exists, whatever its wake_at.
        Lease.objects.acquire(second.lease_key, "w", 60_000)
        third = debounced(3)
        assert third.pk not in {first.pk, second.pk}

    def test_bad_arguments_are_refused_before_any_sql(self) -> None:
        for named, kwargs in [
            ("debounce_ms", {"debounce_ms": 5_000}),
            ("debounce_ms", {"key": "k", "debounce_ms": 0}),
            ("debounce_max_ms", {"key": "k", "debounce_ms": 5, "debounce_max_ms": -1}),
            ("debounce_max_ms", {"key": "k", "debounce_max_ms": 5}),
            ("debounce_mode", {"key": "k", "debounce_ms": 5, "debounce_mode": "first"}),
            ("debounce_ms", {"key": "k", "debounce_ms": 5, "dedup_key": "d"}),
        ]:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError) as caught:
                start_workflow("test.echo_input", 1, **kwargs)  # type: ignore[arg-type]
            assert str(caught.value).startswith(named), caught.value


class DebouncedRunTests(TransactionTestCase):
    def test_the_run_is_driven_once_its_wait_is_over(self) -> None:
        for i in range(3):
            run = debounced(i, debounce_ms=300, debounce_mode="collect")
        assert Worker(holder="w", once=True).run() == 0
        done = WorkflowRun.objects.filter(pk=run.pk, status="completed")
        poll_until(lambda: Worker(holder="w", once=True).run() and done.exists(), timeout=30, interval=0.05)
        assert done.get().output == [0, 1, 2]


@pytest.mark.slow
class DebounceProcessTests(TransactionTestCase):
    def test_a_hundred_starts_racing_in_four_processes_make_one_run_with_every_input(self) -> None:
        starters = [start_script(START_DEBOUNCED, f"p{n}", "25") for n in range(4)]
        try:
            for starter in starters:
                assert read_line(starter, timeout=60) == "ready\n"
            for starter in starters:
                send_line(starter, "go")
            ids = {line for starter in starters for line in finish(starter, timeout=60).split()}
        finally:
            for starter in starters:
                if starter.poll() is None:
                    starter.kill()
                    starter.wait(timeout=10)
        assert len(ids) == 1
        inputs = WorkflowRun.objects.get().input
        assert sorted(inputs) == sorted(f"p{n}-{i}" for n in range(4) for i in range(25))
        for n in range(4):
            assert [x for x in inputs if x.startswith(f"p{n}-")] == [f"p{n}-{i}" for i in range(25)]
