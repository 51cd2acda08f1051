"""
The counts of a fan-out (re-exported by ``pikku_django.models``): one row per
``ctx.map`` or ``ctx.workflows`` step, so that the end of one item is a
constant number of statements however many siblings it has.
"""

from __future__ import annotations

from django.db import models

from pikku_django.models.runs import WorkflowRun, WorkflowStep


class FanOutKind(models.TextChoices):
    MAP = "map", "ctx.map"
    WORKFLOWS = "workflows", "ctx.workflows"


class WorkflowFanOut(models.Model):
    """
    A parent step's items, counted: ``total`` items (each a run whose
    ``parent_step`` is ``step``, at ``parent_index`` 0 to total - 1), the
    first ``released`` of them made due so far (at most ``max_parallel``
    unfinished at once), ``ended`` of them finished. ``halted`` once an item
    failed or was cancelled (``failed_run``): no further item is released,
    and the parent step fails once every item in flight has ended.
    """

    step = models.OneToOneField(
        WorkflowStep, primary_key=True, on_delete=models.CASCADE, related_name="fan_out"
    )
    kind = models.CharField(max_length=16, choices=FanOutKind.choices)
    total = models.PositiveIntegerField()
    max_parallel = models.PositiveIntegerField(null=True, blank=True, help_text="NULL: every item at once.")
    released = models.PositiveIntegerField(default=0, help_text="Items made due so far, in order.")
    ended = models.PositiveIntegerField(default=0, help_text="Items finished (any outcome).")
    halted = models.BooleanField(default=False, help_text="An item failed or was cancelled.")
    failed_run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "pikku_workflow_fanout"

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.step_id}: {self.ended} of {self.total} ended"

    @property
    def is_done(self) -> bool:
        """Has every item ended, so that the parent step can be settled?"""
        return self.ended >= self.total
