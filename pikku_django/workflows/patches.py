"""
``ctx.patched(name)`` and ``ctx.deprecate_patch(name)``: a change to a
workflow's code that runs already in flight do not take. A run takes the
patched path once it holds the patch's marker (a ``WorkflowPatch`` row),
written the first time the run meets the call at its frontier (every stored
step replayed), under the run lease's fence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.errors import WorkflowReplayError
from pikku_django.managers.fence import RunFence
from pikku_django.models import WorkflowPatch, WorkflowRun, WorkflowStep
from pikku_django.sql.conflicts import in_transaction
from pikku_django.workflows.unwind import commits_held_outcome


def unasked_marker(run_id: Any, step_name: str, marker: str) -> WorkflowReplayError:
    """The run holds ``marker``, and its replay reached the new step ``step_name`` without asking for it."""
    return WorkflowReplayError(
        run_id,
        step_name,
        f"patch marker {marker!r}",
        f"no ctx.patched({marker!r}) or ctx.deprecate_patch({marker!r}) before this step",
        "remove a patch only once no run holds it (keep deprecate_patch meanwhile)",
    )


class PatchesMixin:
    """``ctx.patched`` and ``ctx.deprecate_patch`` (mixed into ``RunContext``)."""

    run: WorkflowRun
    run_id: Any
    _using: str
    _seen: set[str]
    _steps: dict[str, WorkflowStep]
    _fence: RunFence | None
    # What patched() answered in this pass, and the markers the code asked for.
    _patches: dict[str, bool]
    _asked: set[str]
    _markers: set[str] | None
    #: The first ``WorkflowReplayError`` this pass met (``unwind``): the pass ends on it.
    replay_error: WorkflowReplayError | None
    # Provided by WaitsMixin: lock the run row under the pass's run lease, or stop.
    _touch_run: Callable[[], None]

    def _init_patches(self) -> None:
        self._patches, self._asked = {}, set()
        self.replay_error = None
        # The run's markers, read once, only for a run that holds any.
        self._markers = None if self.run.has_patches else set()

    @commits_held_outcome
    def patched(self, name: str) -> bool:
        """
        True if this run takes the patch ``name``: it holds its marker, or it
        meets this call at its frontier (then the marker is written, once);
        False for a run whose history was made without it.
        """
        validate.name("name", name)
        self._asked.add(name)
        if name not in self._patches:
            if name in self.held_markers():
                self._patches[name] = True
            else:
                self._patches[name] = self.at_frontier() and self._write_marker(name)
        return self._patches[name]

    def deprecate_patch(self, name: str) -> bool:
        """The patch ``name`` is taken by every run now: True, and a marker of it is expected."""
        validate.name("name", name)
        self._asked.add(name)
        return True

    def held_markers(self) -> set[str]:
        """The patch markers this run holds."""
        if self._markers is None:
            patches = WorkflowPatch.objects.using(self._using).filter(run_id=self.run_id)
            self._markers = set(patches.values_list("name", flat=True))
        return self._markers

    def at_frontier(self) -> bool:
        """Has this pass replayed every step stored for the run (as this pass read them)?"""
        return all(name in self._seen for name in self._steps)

    def check_markers(self, step_name: str) -> None:
        """
        Before a new step runs: every marker the run holds was asked for by
        this pass (``patched`` or ``deprecate_patch``), or the history no
        longer fits the code (``WorkflowReplayError``).
        """
        if self._markers is not None and not self._markers:
            return
        unasked = sorted(self.held_markers() - self._asked)
        if unasked:
            raise unasked_marker(self.run_id, step_name, unasked[0])

    def _write_marker(self, name: str) -> bool:
        """
        Write the marker ``name``, fenced to the pass's run lease, if the run
        is still at its frontier in the store (no step this pass has not
        met): True if the run holds it now. A pass that lost its lease stops.
        """
        touch = self._touch_run
        runs = WorkflowRun.objects.using(self._using)
        steps = WorkflowStep.objects.using(self._using)

        def write() -> bool:
            touch()
            if steps.filter(run_id=self.run_id).exclude(step_name__in=self._seen).exists():
                return False
            runs.filter(pk=self.run_id, has_patches=False).update(has_patches=True)
            if not WorkflowPatch.objects.using(self._using).filter(run_id=self.run_id, name=name).exists():
                WorkflowPatch.objects.using(self._using).create(
                    run_id=self.run_id, name=name, created_at=DbNow()
                )
            return True

        try:
            held = in_transaction(self._using, write)
        except IntegrityError:
            held = True  # another pass wrote it first: the run holds it
        if held:
            self.held_markers().add(name)
            self.run.has_patches = True
        return held
