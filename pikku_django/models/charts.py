"""
The cockpit's per-minute rollup (re-exported by ``pikku_django.models``):
one ``WorkflowMinute`` row per minute of the database clock, queue and
workflow, added to by the transaction that records each run's outcome
(``store.rollup``) and pruned by the sweep after a day.
"""

from __future__ import annotations

from django.db import models

from pikku_django.models.runs import MAX_QUEUE_LENGTH
from pikku_django.sql.rollup import DELAY_BOUNDS_MS, DELAY_COLUMNS

__all__ = ["DELAY_BOUNDS_MS", "DELAY_COLUMNS", "WorkflowMinute", "WorkflowOverview"]


def _bucket(n: int) -> models.PositiveIntegerField[int, int]:
    bound = f"up to {DELAY_BOUNDS_MS[n]} ms" if n < len(DELAY_BOUNDS_MS) else "longer"
    return models.PositiveIntegerField(default=0, help_text=f"Start delays {bound}.")


class WorkflowMinute(models.Model):
    """
    What one minute saw of one workflow on one queue: runs completed, runs
    failed, and the start delays (a run's due time to the take of the pass
    that ended it) counted in fixed buckets, enough for p50 and p95. Tasks
    are counted under their task's dotted path.
    """

    minute = models.BigIntegerField(help_text="The minute's first instant, epoch ms on the database clock.")
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH)
    workflow = models.CharField(max_length=255, help_text="The workflow's name, or a task's dotted path.")
    # Lanes ending runs of one workflow at once would queue on one row's lock:
    # each writes the row of its own shard (``store.rollup.SHARDS``), and
    # the charts add the shards up.
    shard = models.PositiveSmallIntegerField(default=0, help_text="The writers' shard of the minute's row.")
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    delay_0 = _bucket(0)
    delay_1 = _bucket(1)
    delay_2 = _bucket(2)
    delay_3 = _bucket(3)
    delay_4 = _bucket(4)
    delay_5 = _bucket(5)
    delay_6 = _bucket(6)
    delay_7 = _bucket(7)
    delay_8 = _bucket(8)
    delay_9 = _bucket(9)
    delay_10 = _bucket(10)
    delay_11 = _bucket(11)
    delay_12 = _bucket(12)
    delay_13 = _bucket(13)
    delay_14 = _bucket(14)

    class Meta:
        db_table = "pikku_workflow_minute"
        ordering = ["-minute", "queue", "workflow"]
        verbose_name = "workflow minute"
        verbose_name_plural = "workflow minutes"
        constraints = [
            # The outcome's upsert lands on it; the charts and the prune read its minute range.
            models.UniqueConstraint(
                fields=["minute", "queue", "workflow", "shard"], name="pikku_minute_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} on {self.queue} at {self.minute}"


class WorkflowOverview(WorkflowMinute):
    """
    The "Workflows" page's rows (``admin.workflows``): one per workflow name
    the rollup holds, each standing for all of that name's minutes.
    """

    class Meta:
        proxy = True
        verbose_name = "workflow"
        verbose_name_plural = "workflows"
