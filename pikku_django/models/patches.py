"""Patch markers: the ``ctx.patched(name)`` a run took the new path of."""

from __future__ import annotations

from django.db import models

from pikku_django.models.runs import WorkflowRun


class WorkflowPatch(models.Model):
    """
    A run holds the patch ``name``: it met ``ctx.patched(name)`` at its
    frontier, so every later pass takes the patched path. Written once per
    run and name, under the run lease's fence; pruned with its run.
    """

    # No index of its own: the unique (run, name) constraint leads with it.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="patches", db_index=False)
    name = models.CharField(max_length=255)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pikku_workflow_patch"
        ordering = ["run_id", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="pikku_patch_run_name_uniq"),
        ]
        indexes = [
            # The admin's "holds patch X" filter and its list of names.
            models.Index(fields=["name"], name="pikku_patch_name_idx"),
        ]

    def __str__(self) -> str:
        return f"patch {self.name!r} of {self.run_id}"
