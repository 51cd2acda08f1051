"""
Real ``pikku_worker`` processes with every transaction SERIALIZABLE
(``PIKKU_ISOLATION_LEVEL``, read by testproject/settings.py): the lanes'
fan-outs, item ends, child starts and waits meet serialization failures
(PostgreSQL 40001, MySQL/MariaDB 1213), which are sent again, never taken
for an outage, and never charged to a step as a lost worker.

SQLite is left out: its transactions are serializable by construction (one
writer at a time), so no transaction of it is ever rolled back for a
serialization failure.
"""

from __future__ import annotations

import collections
import time

import pytest
from django.db import connection

from pikku_django.errors import StepLeaseExpiredError
from pikku_django.managers import FINISHED_RUN_STATUSES
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.workflows import start_workflow
from tests.support.children import subprocess_env
from tests.support.processes import ProcessTestCase

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite transactions are serializable by construction: no serialization failure to meet",
    ),
]

#: Runs of ``test.fan_mix``, each with ``ITEMS`` items in each of its two maps.
RUNS = 32
ITEMS = 3
#: Every run must have ended well within this (no fixed sleep: polled).
WITHIN_S = 90.0

LOST = f"{StepLeaseExpiredError.__module__}.{StepLeaseExpiredError.__qualname__}"


def expected(n: int) -> dict[str, int]:
    first = [i + 1 for i in range(n)]
    return {"child": 2 * sum(first), "sum": sum(value + 1 for value in first)}


def _statuses(runs: list[WorkflowRun]) -> collections.Counter[str]:
    return collections.Counter(
        WorkflowRun.objects.filter(pk__in=[run.pk for run in runs]).values_list("status", flat=True)
    )


class SerializableProcessTests(ProcessTestCase):
    def wait_for_ends(self, runs: list[WorkflowRun]) -> collections.Counter[str]:
        """Poll until every run of ``runs`` has ended (or ``WITHIN_S`` passed); their statuses."""
        deadline = time.monotonic() + WITHIN_S
        while True:
            statuses = _statuses(runs)
            if set(statuses) <= set(FINISHED_RUN_STATUSES) or time.monotonic() >= deadline:
                return statuses
            time.sleep(0.2)

    def test_fan_outs_waits_and_children_under_serializable_all_complete_without_a_lost_worker(self) -> None:
        env = subprocess_env(
            PIKKU_ISOLATION_LEVEL="serializable",
            # Short leases: a pass that did end early is recovered well within the bound.
            PIKKU_LEASE_TTL_MS="5000",
            PIKKU_STEP_LEASE_MS="3000",
        )
        runs = [start_workflow("test.fan_mix", {"n": ITEMS, "max_parallel": 2}) for _ in range(RUNS)]
        workers = [
            self.worker(name, "--concurrency", "4", "--interval", "0.05", "--sweep-interval", "1", env=env)
            for name in ("a", "b")
        ]
        started = time.monotonic()
        statuses = self.wait_for_ends(runs)
        took = time.monotonic() - started

        logs = "\n".join(self.log(worker)[-3000:] for worker in workers)
        assert statuses == {"completed": RUNS}, f"after {took:.0f} s: {dict(statuses)}\n{logs}"
        for run in WorkflowRun.objects.filter(pk__in=[run.pk for run in runs]):
            assert run.output == expected(ITEMS), (run.pk, run.output)
        # Every item and child completed too, none failed along the way.
        assert not WorkflowRun.objects.exclude(status="completed").exists()
        # No conflict was charged to a step as a lost worker.
        assert not WorkflowStep.objects.filter(losses__gt=0).exists()
        assert not WorkflowStep.objects.filter(error__type=LOST).exists()
        assert not WorkflowStepAttempt.objects.filter(error__type=LOST).exists()
        assert not WorkflowStepAttempt.objects.exclude(status="succeeded").exists()
        # ...nor taken for an outage.
        for worker in workers:
            assert "the database is unavailable" not in self.log(worker), self.log(worker)[-3000:]
