"""
Deduplicated starts (``start_workflow(..., dedup_key=)``): one unfinished
run per (workflow, dedup_key), decided by a unique constraint over
unfinished runs; freed when the run ends; racing starts in several OS
processes make one run.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.test import TestCase, TransactionTestCase

from pikku_django.errors import DuplicateRunError, InvalidArgumentError, PikkuError
from pikku_django.models import WorkflowRun
from pikku_django.workflows import cancel_workflow, retry_workflow, run_workflow, start_workflow
from tests.support.children import finish, read_line, send_line, start_script

#: Waits for "go" on stdin, then starts ``test.double`` under ``dedup_key``
#: ``starts`` times, printing each run's id.
START_DEDUPED = """
import sys
import django
django.setup()
from pikku_django.workflows import start_workflow

dedup_key, starts = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
for i in range(starts):
    print(start_workflow("test.double", i, dedup_key=dedup_key).pk, flush=True)
"""


class DedupStartTests(TestCase):
    def test_a_second_start_returns_the_unfinished_run(self) -> None:
        first = start_workflow("test.double", 1, dedup_key="sync:t1")
        second = start_workflow("test.double", 2, dedup_key="sync:t1")
        assert second.pk == first.pk
        assert second.input == 1
        assert WorkflowRun.objects.count() == 1
        assert first.dedup_key == "sync:t1"

    def test_raise_names_the_unfinished_run(self) -> None:
        first = start_workflow("test.double", 1, dedup_key="sync:t1")
        with pytest.raises(DuplicateRunError) as caught:
            start_workflow("test.double", 2, dedup_key="sync:t1", dedup="raise")
        assert caught.value.run_id == first.pk
        assert str(first.pk) in str(caught.value)
        assert isinstance(caught.value, PikkuError)
        assert WorkflowRun.objects.count() == 1

    def test_keys_are_per_workflow_and_exact(self) -> None:
        a = start_workflow("test.double", 1, dedup_key="k")
        b = start_workflow("test.noop", {"steps": 1}, dedup_key="k")
        c = start_workflow("test.double", 1, dedup_key="K")
        d = start_workflow("test.double", 1, dedup_key="k ")
        assert len({a.pk, b.pk, c.pk, d.pk}) == 4

    def test_the_key_is_free_once_the_run_ends(self) -> None:
        for end in ("completed", "cancelled", "failed"):
            run = start_workflow("test.double", 3, dedup_key=f"once-{end}")
            if end == "completed":
                assert run_workflow(run.pk).status == "completed"
            elif end == "cancelled":
                assert cancel_workflow(run.pk) is True
            else:
                WorkflowRun.objects.filter(pk=run.pk).update(status="failed", wake_at=None)
            again = start_workflow("test.double", 4, dedup_key=f"once-{end}", dedup="raise")
            assert again.pk != run.pk
            assert again.status == "running"

    def test_a_suspended_run_holds_its_key(self) -> None:
        run = start_workflow("test.double", 1, dedup_key="s")
        WorkflowRun.objects.filter(pk=run.pk).update(status="suspended")
        assert start_workflow("test.double", 2, dedup_key="s").pk == run.pk

    def test_the_database_refuses_a_second_unfinished_run(self) -> None:
        start_workflow("test.double", 1, dedup_key="db")
        with pytest.raises(IntegrityError), transaction.atomic():
            WorkflowRun.objects.create_run("test.double", 2, dedup_key="db")

    def test_with_an_idempotency_key(self) -> None:
        first = start_workflow("test.double", 1, dedup_key="d", idempotency_key="i-1")
        assert start_workflow("test.double", 2, dedup_key="d", idempotency_key="i-1").pk == first.pk
        run_workflow(first.pk)
        # The idempotency key still answers with its run, ended or not.
        assert start_workflow("test.double", 2, dedup_key="d", idempotency_key="i-1").pk == first.pk
        other = start_workflow("test.double", 2, dedup_key="d", idempotency_key="i-2")
        assert other.pk != first.pk

    def test_bad_arguments_are_refused_before_any_sql(self) -> None:
        bad: list[tuple[str, dict[str, object]]] = [
            ("dedup_key", {"dedup_key": ""}),
            ("dedup_key", {"dedup_key": "x" * 256}),
            ("dedup_key", {"dedup_key": 5}),
            ("dedup", {"dedup_key": "k", "dedup": "ignore"}),
            ("key", {"key": ""}),
            ("key", {"key": "x" * 256}),
        ]
        for named, kwargs in bad:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError) as caught:
                start_workflow("test.double", 1, **kwargs)  # type: ignore[arg-type]
            assert str(caught.value).startswith(named), caught.value


class DedupInTransactionTests(TransactionTestCase):
    def test_a_lost_start_inside_a_transaction_leaves_it_usable(self) -> None:
        first = start_workflow("test.double", 1, dedup_key="tx")
        with transaction.atomic():
            again = start_workflow("test.double", 2, dedup_key="tx")
            other = start_workflow("test.double", 3, dedup_key="tx-2")
        assert again.pk == first.pk
        assert WorkflowRun.objects.filter(pk=other.pk).exists()

    def test_a_start_rolled_back_frees_its_key(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            start_workflow("test.double", 1, dedup_key="rb")
            raise RuntimeError("rolled back")
        assert start_workflow("test.double", 1, dedup_key="rb", dedup="raise").status == "running"


@pytest.mark.slow
class DedupProcessTests(TransactionTestCase):
    def test_fifty_starts_racing_in_five_processes_make_one_run(self) -> None:
        starters = [start_script(START_DEDUPED, "race", "10") for _ in range(5)]
        try:
            for starter in starters:
                assert read_line(starter, timeout=60) == "ready\n"
            for starter in starters:
                send_line(starter, "go")
            ids = [line for starter in starters for line in finish(starter, timeout=60).split()]
        finally:
            for starter in starters:
                if starter.poll() is None:
                    starter.kill()
                    starter.wait(timeout=10)
        assert len(ids) == 50
        assert len(set(ids)) == 1
        assert [str(pk) for pk in WorkflowRun.objects.values_list("pk", flat=True)] == ids[:1]


class DedupRetryTests(TestCase):
    def test_a_retry_whose_key_another_run_holds_is_refused(self) -> None:
        first = start_workflow("test.double", 1, dedup_key="r")
        assert cancel_workflow(first.pk)
        second = start_workflow("test.double", 2, dedup_key="r")
        with pytest.raises(DuplicateRunError) as caught:
            retry_workflow(first.pk)
        assert caught.value.run_id == second.pk
        assert WorkflowRun.objects.get(pk=first.pk).status == "cancelled"
        run_workflow(second.pk)
        assert retry_workflow(first.pk) is True
