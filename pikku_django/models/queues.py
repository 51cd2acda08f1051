"""
Queues as rows (re-exported by ``pikku_django.models``): one
``WorkflowQueue`` per queue that has runs or is configured in
``PIKKU_QUEUES``, made as needed (``store.queues.sync_queues``), holding what
an operator sets on a queue: whether it is paused.
"""

from __future__ import annotations

from django.db import models

from pikku_django.managers.queues import WorkflowQueueQuerySet
from pikku_django.models.runs import MAX_QUEUE_LENGTH


class WorkflowQueue(models.Model):
    """
    A queue of runs. ``paused``: no pass of its runs starts while it is set
    (the worker's take is guarded on it in the take's own statement), and
    the passes in hand finish.
    """

    # Compared with ``WorkflowRun.queue`` in the take's statement: the same field type and collation.
    name = models.CharField(max_length=MAX_QUEUE_LENGTH, unique=True)
    paused = models.BooleanField(default=False)
    #: When ``paused`` was last changed (by the database clock), for the admin.
    changed_at = models.DateTimeField(null=True, blank=True)

    objects = WorkflowQueueQuerySet.as_manager()

    class Meta:
        db_table = "pikku_workflow_queue"
        ordering = ["name"]
        verbose_name = "queue"
        verbose_name_plural = "queues"
        indexes = [
            # The due look's and the take's "which queues are paused", read from the index alone.
            models.Index(fields=["paused", "name"], name="pikku_queue_paused_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (paused)" if self.paused else self.name
