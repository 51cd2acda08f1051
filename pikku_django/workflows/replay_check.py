"""
``pikku_replay_check``'s replay: each unfinished run's workflow called on
a context that answers from the stored history only (``ReplayContext``):
no step function is called and no row is written. A run whose history no
longer fits the code meets a ``WorkflowReplayError`` here, as its next pass
would; the replay of a run stops at its frontier (the first step the
history has not finished).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from pikku_django import validate
from pikku_django.errors import (
    InvalidArgumentError,
    SignalTimeoutError,
    StepFailedError,
    StepFunctionMismatchError,
    WorkflowNotFoundError,
    WorkflowReplayError,
)
from pikku_django.managers.signals import SIGNAL_RPC
from pikku_django.models import WorkflowPatch, WorkflowRun, WorkflowStep
from pikku_django.store.fanout import MAP_RPC, WORKFLOWS_RPC
from pikku_django.workflows.fanout_items import fan_out_fits, function_path
from pikku_django.workflows.patches import unasked_marker
from pikku_django.workflows.registry import get_workflow
from pikku_django.workflows.replay import fitting_rpc_name
from pikku_django.workflows.waits import CHILD_RPC, SIGNAL_TIMEOUT_TYPE, SLEEP_RPC

logger = logging.getLogger(__name__)

#: The statuses of the runs checked unless told otherwise.
UNFINISHED = ("running", "suspended")

#: Runs read per page (one query for the runs, one for their steps, one for their markers).
PAGE_SIZE = 500


@dataclass(frozen=True)
class Mismatch:
    """A run whose history would not replay: where, and why (the ``WorkflowReplayError``'s message)."""

    run_id: str
    workflow: str
    step: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"run_id": self.run_id, "workflow": self.workflow, "step": self.step, "reason": self.reason}


class Frontier(BaseException):
    """The replay reached a step the history has not finished: the rest is not history yet."""


class ReplayContext:
    """
    What a workflow is called with by the check: ``ctx.step`` and the rest
    answered from the stored steps and patch markers. Anything this context
    does not know ends the replay where it is called (as a frontier).
    """

    def __init__(self, run: WorkflowRun, steps: Sequence[WorkflowStep], markers: set[str]) -> None:
        self.run = run
        self.run_id = run.pk
        self.input = run.input
        self._steps = {step.step_name: step for step in steps}
        self._markers = markers
        self._seen: set[str] = set()
        self._asked: set[str] = set()
        self._signal_waits: dict[str, int] = {}
        self.replay_error: WorkflowReplayError | None = None

    def __getattr__(self, name: str) -> Any:
        raise Frontier(name)

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        step = self._stored(name)
        self._fits(lambda: fitting_rpc_name(self.run_id, name, step.rpc_name, fn))
        return self._outcome(step)

    def sleep(self, name: str, ms: int) -> None:
        self._outcome(self._special(name, SLEEP_RPC))

    def wait_for_signal(self, name: str, timeout_ms: int | None = None) -> Any:
        count = self._signal_waits[name] = self._signal_waits.get(name, 0) + 1
        step = self._special(name if count == 1 else f"{name}#{count}", SIGNAL_RPC)
        if step.status == "failed" and (step.error or {}).get("type") == SIGNAL_TIMEOUT_TYPE:
            raise SignalTimeoutError(name, int((step.data or {}).get("timeout_ms") or 0))
        return self._outcome(step)

    def workflow(self, name: str, workflow_name: str, input: Any = None) -> Any:
        step = self._special(name, CHILD_RPC)
        stored = (step.data or {}).get("workflow")
        if stored != workflow_name:
            self._fits(
                lambda: _raise(StepFunctionMismatchError(self.run_id, name, str(stored), workflow_name))
            )
        return self._outcome(step)

    def map(self, name: str, fn: Callable[[Any], Any], items: Sequence[Any], **options: Any) -> Any:
        step = self._special(name, MAP_RPC)
        target = {"fn": function_path("fn", fn)}
        self._fits(lambda: fan_out_fits(self.run_id, name, step.data or {}, target, list(items), "items"))
        return self._outcome(step)

    def workflows(self, name: str, workflow_name: str, inputs: Sequence[Any], **options: Any) -> Any:
        step = self._special(name, WORKFLOWS_RPC)
        target = {"workflow": workflow_name}
        self._fits(lambda: fan_out_fits(self.run_id, name, step.data or {}, target, list(inputs), "inputs"))
        return self._outcome(step)

    def patched(self, name: str) -> bool:
        """As a pass would answer: held, or at the frontier (where a pass would write the marker)."""
        self._asked.add(name)
        return name in self._markers or all(step in self._seen for step in self._steps)

    def deprecate_patch(self, name: str) -> bool:
        self._asked.add(name)
        return True

    # -- the history ------------------------------------------------------------

    def _stored(self, name: str) -> WorkflowStep:
        """The stored step ``name``; a step the history lacks is the frontier, past the markers' check."""
        if self.replay_error is not None:
            raise self.replay_error
        validate.name("name", name)
        if name in self._seen:
            raise InvalidArgumentError(
                f"name: step {name!r} is used twice in workflow {self.run.workflow!r}."
            )
        self._seen.add(name)
        step = self._steps.get(name)
        if step is None:
            self._frontier(name)
        return step

    def _special(self, name: str, rpc_name: str) -> WorkflowStep:
        step = self._stored(name)
        if step.rpc_name != rpc_name:
            self._fits(lambda: _raise(StepFunctionMismatchError(self.run_id, name, step.rpc_name, rpc_name)))
        return step

    def _fits(self, check: Callable[[], Any]) -> None:
        """Run ``check``, keeping its ``WorkflowReplayError`` (reported even if the workflow catches it)."""
        try:
            check()
        except WorkflowReplayError as error:
            self.replay_error = error
            raise

    def _outcome(self, step: WorkflowStep) -> Any:
        if step.status == "succeeded":
            return step.result
        if step.status == "failed" and step.is_exhausted:
            raise StepFailedError(step.step_name, step.attempt, step.error)
        self._frontier(step.step_name)

    def _frontier(self, name: str) -> NoReturn:
        """
        The replay is at the run's frontier: every marker the run holds was
        written before it, so the code must have asked for each by now (a
        pass finds one it did not before its next new step).
        """
        unasked = sorted(self._markers - self._asked)
        if unasked:
            self._fits(lambda: _raise(unasked_marker(self.run_id, name, unasked[0])))
        raise Frontier(name)


def _raise(error: BaseException) -> None:
    raise error


def replay(run: WorkflowRun, steps: Sequence[WorkflowStep], markers: set[str]) -> Mismatch | None:
    """Replay ``run`` on its stored ``steps`` and ``markers``: the mismatch it would meet, or None."""
    try:
        fn = get_workflow(run.workflow)
    except WorkflowNotFoundError:
        return None
    ctx = ReplayContext(run, steps, markers)
    try:
        fn(ctx, run.input)
    except WorkflowReplayError as error:
        ctx.replay_error = error
    except (Frontier, Exception):
        # Its frontier, or an end of its own: nothing that does not fit, unless caught on the way.
        logger.debug("Run %s replays to its frontier.", run.pk)
    met = ctx.replay_error
    if met is None:
        return None
    return Mismatch(str(run.pk), run.workflow, met.step_name, str(met))


def unfinished_runs(
    alias: str, statuses: Sequence[str], page_size: int = PAGE_SIZE
) -> Iterator[list[tuple[WorkflowRun, list[WorkflowStep], set[str]]]]:
    """Pages of the runs in ``statuses``, by id, each run with its steps and markers (read per page)."""
    runs = WorkflowRun.objects.using(alias).filter(status__in=statuses).order_by("pk")
    last = None
    while True:
        page = list((runs if last is None else runs.filter(pk__gt=last))[:page_size])
        if not page:
            return
        ids = [run.pk for run in page]
        steps: dict[Any, list[WorkflowStep]] = {pk: [] for pk in ids}
        for step in WorkflowStep.objects.using(alias).filter(run_id__in=ids).order_by("created_at", "id"):
            steps[step.run_id].append(step)
        markers: dict[Any, set[str]] = {pk: set() for pk in ids}
        marked = [run.pk for run in page if run.has_patches]
        if marked:
            patches = WorkflowPatch.objects.using(alias).filter(run_id__in=marked)
            for run_id, name in patches.values_list("run_id", "name"):
                markers[run_id].add(name)
        yield [(run, steps[run.pk], markers[run.pk]) for run in page]
        last = page[-1].pk
        if len(page) < page_size:
            return
