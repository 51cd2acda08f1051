"""
The per-minute rollup under a worker process of four lanes (each adding to
its own shard of a minute's row): what it counted equals the outcomes the
database holds once the worker has drained the runs.
"""

from __future__ import annotations

from pikku_django.models import WorkflowRun
from testproject.testing import tasks
from tests.store.test_rollup import outcomes, rolled_up
from tests.support.workers import WorkerProcessTestCase

TASKS = 120


class RollupProcessTests(WorkerProcessTestCase):
    def test_four_lanes_count_every_outcome_once(self) -> None:
        for i in range(TASKS):
            if i % 10 == 0:
                tasks.explode.enqueue("no")
            else:
                tasks.add.enqueue(i, 1)
        proc = self.worker("--once", "--concurrency", "4", "--holder", "rollup")
        code, _ = self.exits(proc, timeout=60)
        assert code == 0, self.log(proc)
        assert not WorkflowRun.objects.filter(status__in=("running", "suspended")).exists()
        expected = outcomes()
        assert expected["default", "testproject.testing.tasks.add", "completed"] == TASKS - TASKS // 10
        assert expected["default", "testproject.testing.tasks.explode", "failed"] == TASKS // 10
        assert rolled_up() == expected
