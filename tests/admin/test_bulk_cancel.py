"""
Bulk cancel and wake from the admin, in bounded batches on a real database:
no transaction covers more than ``BULK_BATCH_RUNS`` runs, every guarantee of
a single cancel holds across batches (children cancelled, steps fenced, a
parent step settled), and a lease renewed by another OS process meanwhile
is never refused nor kept waiting for the whole cancel.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import BULK_BATCH_RUNS, WOKEN
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.store.lifecycle import cancel_runs
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.children import finish, kill_all, read_line, send_line, start_script, subprocess_env

CANCELLED = "pikku_django.errors.WorkflowCancelledError"

#: A lease renewer in its own process: takes the lease, says "ready", renews it
#: every 10 ms until a line arrives on stdin, says "renewing" after the first
#: renewal, and at the end prints when each renewal returned (epoch seconds),
#: the longest one took, and every failure (an error, or the lease lost).
RENEWER = """
import json, select, sys, time
import django
django.setup()
from pikku_django.models import Lease

lease = Lease.objects.acquire(sys.argv[1], "renewer", 600_000)
assert lease is not None
print("ready", flush=True)
returned, failures, slowest = [], [], 0.0
while not select.select([sys.stdin], [], [], 0.01)[0]:
    started = time.time()
    try:
        renewed = Lease.objects.refresh(lease, 600_000)
    except Exception as error:
        failures.append(repr(error))
        renewed = lease
    if renewed is None:
        failures.append("the lease was lost")
        break
    lease = renewed
    returned.append(time.time())
    slowest = max(slowest, returned[-1] - started)
    if len(returned) == 1:
        print("renewing", flush=True)
print(json.dumps({"returned": returned, "slowest": slowest, "failures": failures}), flush=True)
"""


def many_runs(count: int, with_step_every: int = 0) -> list[Any]:
    """
    ``count`` running runs in one commit; then every ``with_step_every``-th
    gets a claimed step (a claim takes a lease, in a commit of its own).
    """
    with transaction.atomic():
        ids = [WorkflowRun.objects.create_run("bulk").pk for _ in range(count)]
    for run_id in ids[::with_step_every] if with_step_every else []:
        WorkflowStep.objects.insert_step(WorkflowRun(pk=run_id), "work", "bulk.work")
        assert WorkflowStep.objects.claim(run_id, "work", "bulk.work", 600_000) is not None
    return ids


class TransactionLog:
    """
    An execute wrapper that groups the statements run inside each outermost
    transaction on ``connection`` (one per ``atomic()`` block it opens).
    """

    def __init__(self) -> None:
        self.blocks: list[tuple[object, list[str]]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if connection.in_atomic_block:
            outermost = connection.atomic_blocks[0]
            if not self.blocks or self.blocks[-1][0] is not outermost:
                self.blocks.append((outermost, []))
            self.blocks[-1][1].append(sql)
        return execute(sql, params, many, context)

    def run_updates(self) -> list[int]:
        """How many UPDATEs of the run table each transaction ran (one per run it ended)."""
        table = connection.ops.quote_name(WorkflowRun._meta.db_table)
        return [
            sum(1 for sql in statements if sql.lstrip().upper().startswith(f"UPDATE {table}".upper()))
            for _, statements in self.blocks
        ]


class AdminTestCase(TransactionTestCase):
    def setUp(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)
        self.url = reverse("admin:pikku_django_workflowrun_changelist")

    def act_on_all(self, action: str) -> str:
        """Run ``action`` on every run of the changelist ("select all"); returns the page's message."""
        posted = {"action": action, "select_across": "1", "index": "0", "_selected_action": ["x"]}
        response = self.client.post(self.url, posted)
        assert response.status_code == 302, response.content.decode()[:2000]
        return self.client.get(self.url).content.decode()


class BoundedBatchTests(AdminTestCase):
    def test_no_transaction_of_the_admin_cancel_covers_more_than_a_batch(self) -> None:
        count = 2 * BULK_BATCH_RUNS + 7
        ids = many_runs(count, with_step_every=5)
        log = TransactionLog()
        with connection.execute_wrapper(log):
            body = self.act_on_all("cancel_runs")
        assert f"Cancelled {count} runs." in body
        updates = [n for n in log.run_updates() if n]
        assert len(updates) == math.ceil(count / BULK_BATCH_RUNS), updates
        assert max(updates) == BULK_BATCH_RUNS and sum(updates) == count
        assert set(WorkflowRun.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"cancelled"}
        fenced = WorkflowStep.objects.filter(run_id__in=ids)
        assert fenced.count() == math.ceil(count / 5)
        assert set(fenced.values_list("status", "lease_expires_at")) == {("failed", None)}
        attempts = WorkflowStepAttempt.objects.filter(step__run_id__in=ids)
        assert set(attempts.values_list("status", flat=True)) == {"failed"}

    def test_the_admin_wakes_in_updates_of_a_batch_each(self) -> None:
        count = 2 * BULK_BATCH_RUNS + 1
        ids = many_runs(count)
        WorkflowRun.objects.filter(pk__in=ids[:3]).update(status="completed", wake_at=None)
        WorkflowRun.objects.filter(pk__in=ids[3:]).update(wake_at=Lease.objects.db_now_ms() + 600_000)
        log = TransactionLog()
        table = connection.ops.quote_name(WorkflowRun._meta.db_table)
        with connection.execute_wrapper(log), CaptureQueriesContext(connection) as statements:
            body = self.act_on_all("wake_runs")
        assert f"Woke {count - 3} runs. Skipped 3 not running." in body
        updates = [q for q in statements if q["sql"].lstrip().upper().startswith(f"UPDATE {table}".upper())]
        assert len(updates) == math.ceil((count - 3) / BULK_BATCH_RUNS)
        assert not any(log.run_updates()), "a wake UPDATE ran inside a transaction"
        assert set(WorkflowRun.objects.filter(pk__in=ids[3:]).values_list("wake_at", flat=True)) == {WOKEN}


class AcrossBatchesTests(TransactionTestCase):
    """A batch of two runs, so that a parent and its child fall in different batches."""

    def parent_and_child(self) -> tuple[WorkflowRun, WorkflowRun]:
        """A parent run parked on a child that waits for a signal."""
        parent = run_workflow(start_workflow("test.parent", {"child": "test.signals"}).pk)
        child = WorkflowRun.objects.get(parent=parent)
        run_workflow(child.pk)
        assert WorkflowRun.objects.get(pk=child.pk).status == "suspended"
        return parent, child

    def test_parents_and_children_in_any_order_of_batches(self) -> None:
        first_parent, its_child = self.parent_and_child()
        later_parent, early_child = self.parent_and_child()
        alone = start_workflow("test.steps", {"steps": 1})
        # The child of one parent in the first batch, its parent in a later one;
        # the other parent first, its child (cancelled with it) in a later batch.
        order = [early_child.pk, first_parent.pk, alone.pk, its_child.pk, later_parent.pk]
        assert cancel_runs("default", order, batch_size=2) == 5
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert set(statuses.values()) == {"cancelled"}
        assert set(WorkflowStep.objects.values_list("status", flat=True)) == {"failed"}
        assert cancel_runs("default", order, batch_size=2) == 0

    def test_a_child_cancelled_alone_settles_its_parents_step_and_wakes_it(self) -> None:
        parent, child = self.parent_and_child()
        assert cancel_runs("default", [child.pk], batch_size=1) == 1
        step = WorkflowStep.objects.get(run=parent, child_run=child)
        assert (step.status, step.error["type"], step.error["child_run"]) == (
            "failed",
            CANCELLED,
            str(child.pk),
        )
        woken = WorkflowRun.objects.get(pk=parent.pk)
        assert (woken.status, woken.wake_at) == ("running", WOKEN)
        assert run_workflow(parent.pk).status == "completed"

    def test_a_batch_size_is_a_whole_number_above_zero(self) -> None:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidArgumentError, match="^batch_size"):
                cancel_runs("default", [], batch_size=bad)  # type: ignore[arg-type]


class RenewalBesideBulkCancelTests(AdminTestCase):
    """A lease renewed by another process while the admin cancels a thousand runs, in batches."""

    # Four batches of BULK_BATCH_RUNS: the renewal must get in between each two.
    RUNS = 4 * BULK_BATCH_RUNS

    def renewer_env(self) -> dict[str, str]:
        # On SQLite the renewer keeps Django's defaults (a 5 s busy timeout), so
        # a cancel that held the write lock that long would fail its renewal.
        return subprocess_env(PIKKU_SQLITE_DJANGO_DEFAULTS="1")

    def test_a_renewal_in_another_process_never_fails_nor_waits_out_the_cancel(self) -> None:
        ids = many_runs(self.RUNS, with_step_every=4)
        renewer = start_script(RENEWER, "bulk:renewer", env=self.renewer_env())
        self.addCleanup(kill_all, [renewer])
        assert read_line(renewer, timeout=60).strip() == "ready"
        assert read_line(renewer, timeout=60).strip() == "renewing"
        started = time.time()
        body = self.act_on_all("cancel_runs")
        took = time.time() - started
        send_line(renewer, "stop")
        report = json.loads(finish(renewer, timeout=60).strip().splitlines()[-1])
        assert f"Cancelled {self.RUNS} runs." in body
        assert WorkflowRun.objects.filter(pk__in=ids).exclude(status="cancelled").count() == 0
        assert report["failures"] == []
        during = [at for at in report["returned"] if started <= at <= started + took]
        # Renewals went on while the cancel ran, none of them waiting for most of it.
        assert len(during) >= 3, (len(during), took)
        assert report["slowest"] < took / 2, (report["slowest"], took)
