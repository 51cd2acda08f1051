from __future__ import annotations

from django.db import models


class StepCall(models.Model):
    """One call of a step function's body, by whom and when (DB clock)."""

    run_id = models.UUIDField()
    step = models.CharField(max_length=100)
    pid = models.IntegerField()
    at_ms = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.step} of {self.run_id} by {self.pid}"


class PassRecord(models.Model):
    """One pass of a workflow function over a run, start to end on the DB clock."""

    run_id = models.UUIDField()
    pid = models.IntegerField()
    start_ms = models.BigIntegerField()
    end_ms = models.BigIntegerField()

    def __str__(self) -> str:
        return f"pass of {self.run_id} by {self.pid}"
