"""
What a worker runs beside its lanes, each a ``Poller``: the sweep (every
``--sweep-interval`` seconds) and the scheduler (a ``tick()`` a second). The
PostgreSQL wake-up listener is ``managers.wakeups.Listener``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pikku_django.loops import Poller
from pikku_django.schedules import tick

if TYPE_CHECKING:
    from pikku_django.worker import Worker

logger = logging.getLogger(__name__)


class SweepLoop(Poller):
    """The worker's sweep: one ``sweep()`` pass every ``--sweep-interval`` seconds."""

    wakes = False

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-sweep", stop=worker.stopping, interval=worker.sweep_interval)
        self.using = worker.using

    def poll(self) -> bool:
        from pikku_django.sweep import sweep

        report = sweep(using=self.using)
        logger.debug("Sweep: %s", report.summary())
        return False


class SchedulerLoop(Poller):
    """The worker's scheduler: one ``schedules.tick()`` a second (safe on every worker at once)."""

    wakes = False

    def __init__(self, worker: Worker) -> None:
        super().__init__("pikku-scheduler", stop=worker.stopping, interval=1.0)
        self.using = worker.using

    def poll(self) -> bool:
        tick(using=self.using)
        return False
