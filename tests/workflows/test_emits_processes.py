"""
A run publishing 1,000 items while its workers are SIGKILLed at three random
points: readers that start before, during and after it get exactly offsets
0-999, each once and in order.
"""

from __future__ import annotations

import random
import signal
import threading
from typing import Any

import pytest
from django.db import connections

from pikku_django.models import WorkflowRun, WorkflowStreamItem
from pikku_django.workflows import read_stream, start_workflow
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase, status

pytestmark = pytest.mark.slow

#: The items the run publishes from its code, a step before every ``EVERY`` of them.
COUNT = 1_000
EVERY = 50


class PublishUnderKillsTests(ProcessTestCase):
    def test_items_survive_killed_workers_exactly_once_in_order(self) -> None:
        run = start_workflow("test.publish_many", {"count": COUNT, "every": EVERY})
        seen: dict[str, list[tuple[int, Any]]] = {}

        def read(name: str) -> None:
            try:
                seen[name] = list(read_stream(run.pk, "items", timeout_ms=60_000))
            finally:
                connections.close_all()

        readers = [threading.Thread(target=read, args=("before",))]
        readers[0].start()
        # Short leases, so a killed worker's run is taken again within a second or two.
        env = subprocess_env(PIKKU_LEASE_TTL_MS="1000", PIKKU_STEP_LEASE_MS="1000")
        rng = random.Random()  # noqa: S311  (not a secret)
        # Three points between items 1 and 900: a pass dies mid-run, its items so far committed.
        targets = sorted(rng.sample(range(1, 900), 3))
        for kill, target in enumerate(targets):
            victim = self.worker(f"victim-{kill}", "--interval", "0.05", env=env)
            poll_until(lambda t=target: self._count(run) >= t, timeout=60)
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=10) == -signal.SIGKILL
            if kill == 0:
                readers.append(threading.Thread(target=read, args=("during",)))
                readers[-1].start()
        self.worker("last", "--interval", "0.05", env=env)
        poll_until(lambda: status(run) == "completed", timeout=90)
        for reader in readers:
            reader.join(timeout=60)
        read("after")
        expected = [(i, i) for i in range(COUNT)]
        assert seen["before"] == expected, targets
        assert seen["after"] == expected, targets
        # A reader that started during the run began at offset 0 too.
        assert seen["during"] == expected, targets
        offsets = list(
            WorkflowStreamItem.objects.filter(run=run).order_by("offset").values_list("offset", flat=True)
        )
        assert offsets == list(range(COUNT))
        assert WorkflowRun.objects.get(pk=run.pk).output == {"count": COUNT}

    @staticmethod
    def _count(run: WorkflowRun) -> int:
        return WorkflowStreamItem.objects.filter(run=run, stream="items").count()
