"""The @workflow registry: every workflow function this process knows, by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError, WorkflowNotFoundError, WorkflowRegistrationError
from pikku_django.managers.versions import note_workflow

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun

WorkflowFunction = Callable[[Any, Any], Any]
F = TypeVar("F", bound=WorkflowFunction)

_registry: dict[str, WorkflowFunction] = {}

#: Workflows only pikku_django itself starts runs of (the Tasks backend's).
_internal: set[str] = set()


@dataclass(frozen=True)
class FirstStep:
    """
    The step a pass of a run will claim first, known from the run alone (a
    Django task's one step): a worker's take claims it in its own commit
    (``managers.takes.take_run``), with the same guarded claim a pass makes.
    """

    name: str
    rpc_name: str
    lease_ms: int
    #: The run has no other step: the step claimed is every step a pass replays.
    only: bool = False


#: Per workflow, what names its first step from the run (``workflow(first_step=...)``).
_first_steps: dict[str, Callable[[WorkflowRun], FirstStep | None]] = {}


def dotted_name(fn: Callable[..., Any]) -> str:
    """``module.qualname``: how a step's function is named in the store."""
    return f"{fn.__module__}.{fn.__qualname__}"


def workflow(
    name: str,
    *,
    internal: bool = False,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None = None,
) -> Callable[[F], F]:
    """
    Register ``fn(ctx, input)`` as the workflow ``name``. An ``internal``
    workflow's runs are started only by pikku_django's own code
    (``create_run(..., internal=True)``), never by ``start_workflow``.
    ``first_step(run)``: the step its pass claims first, when the run alone
    says which (see ``FirstStep``); None when it cannot tell.
    """
    validate.name("name", name)

    def register(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@workflow({name!r}) decorates a function, not {fn!r}.")
        existing = _registry.get(name)
        # The same function imported again (a reload) is not a conflict.
        if existing is not None and dotted_name(existing) != dotted_name(fn):
            raise WorkflowRegistrationError(
                f"Workflow {name!r} is registered twice: by {dotted_name(existing)} and by "
                f"{dotted_name(fn)}. Give one of them another name."
            )
        _registry[name] = fn
        note_workflow(name, fn)
        if internal:
            _internal.add(name)
        if first_step is not None:
            _first_steps[name] = first_step
        fn.workflow_name = name  # type: ignore[attr-defined]
        return fn

    return register


def get_workflow(name: str) -> WorkflowFunction:
    """The function registered as ``name``, or ``WorkflowNotFoundError``."""
    try:
        return _registry[name]
    except KeyError:
        raise WorkflowNotFoundError(name) from None


def first_step_of(run: WorkflowRun) -> FirstStep | None:
    """The step a pass of ``run`` claims first, if its workflow can tell from the run alone."""
    predict = _first_steps.get(run.workflow)
    return None if predict is None else predict(run)


def registered() -> dict[str, WorkflowFunction]:
    """A copy of the registry (name to function)."""
    return dict(_registry)


def is_internal(name: str) -> bool:
    """Is ``name`` a workflow whose runs only pikku_django itself starts?"""
    return name in _internal


def child_workflow(argument: str, name: object) -> str:
    """
    ``name`` as the workflow of a child run (``ctx.workflow``,
    ``ctx.workflows``): registered, and not one of pikku_django's own;
    refused naming ``argument`` otherwise.
    """
    validate.name(argument, name)
    assert isinstance(name, str)
    if name not in _registry:
        raise WorkflowNotFoundError(name, argument)
    if name in _internal:
        raise InvalidArgumentError(f"{argument}: {name!r} is pikku_django's own workflow.")
    return name
