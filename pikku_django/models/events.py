"""What a run tells the world while it runs: its events (the last value per key) and its streams."""

from __future__ import annotations

from django.db import models

from pikku_django.models.runs import WorkflowRun


class WorkflowEvent(models.Model):
    """
    The last value a run set for ``key`` (``ctx.set_event``, or a step's
    ``current_step().set_event``); kept and pruned with its run.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events", db_index=False)
    key = models.CharField(max_length=255)
    value = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "pikku_workflow_event"
        ordering = ["key"]
        constraints = [
            # One row per key of a run; also the run FK's index and the readers' probe.
            models.UniqueConstraint(fields=["run", "key"], name="pikku_event_run_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"event {self.key!r} of {self.run_id}"


class WorkflowStreamItem(models.Model):
    """
    One item a run published to ``stream``: offsets are dense and rise from 0
    per (run, stream), each taken once (unique); kept and pruned with its run.
    """

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="stream_items", db_index=False
    )
    stream = models.CharField(max_length=255)
    offset = models.PositiveBigIntegerField()
    item = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pikku_workflow_stream_item"
        ordering = ["run_id", "stream", "offset"]
        constraints = [
            # Each offset is taken once; also the index of "the next items from k" and of the run FK.
            models.UniqueConstraint(fields=["run", "stream", "offset"], name="pikku_stream_run_off_uniq"),
        ]

    def __str__(self) -> str:
        return f"item {self.offset} of stream {self.stream!r} of {self.run_id}"
