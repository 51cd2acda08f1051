"""
Worker processes (re-exported by ``pikku_django.models``): one
``WorkflowWorker`` row per ``pikku_worker`` process, written by its
heartbeat when what it says changes (``worker.beat``) and removed when it
stops. Whether its worker lives is told by the lock on its name
(``sql.names.names_held``), not by the row.
"""

from __future__ import annotations

from django.db import models


class WorkflowWorker(models.Model):
    """
    A worker process as its heartbeat last wrote it; times in epoch ms on
    the database clock (``seen_at``: when the row was last written).
    """

    holder = models.CharField(max_length=255, unique=True)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(default=0)
    lanes = models.PositiveIntegerField(default=1)
    #: The queues it drives, comma-separated; empty for every queue.
    queues = models.TextField(blank=True, default="")
    runs_in_hand = models.PositiveIntegerField(default=0)
    started_at = models.BigIntegerField()
    seen_at = models.BigIntegerField()
    #: The version of the project's code it runs, where one is known; else empty.
    code_version = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "pikku_workflow_worker"
        ordering = ["holder"]
        verbose_name = "worker"
        verbose_name_plural = "workers"

    def __str__(self) -> str:
        return self.holder
