"""
OpenTelemetry spans (the ``otel`` extra: ``opentelemetry-api``; a project
installs and configures the SDK and its exporters). A PRODUCER span at each
start (``start_workflow``, a task's ``enqueue``), a child of the caller's
current span, whose W3C trace context is stored on the run
(``WorkflowRun.trace_context``); a CONSUMER span per pass, a child of that
enqueue span; a span per step attempt, the first a child of the enqueue
span, later ones children of their pass and linked to the enqueue span; a
lost worker is an event (``pikku.worker_lost``) on the pass that took its
step over. Only ``workflows.tracing`` imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

__all__ = ["attempt_span", "enqueue_span", "pass_span", "worker_lost_event"]

#: The instrumentation scope's name.
TRACER_NAME = "pikku_django"


def _tracer() -> trace.Tracer:
    # Asked each time: a tracer provider set after import is used.
    return trace.get_tracer(TRACER_NAME)


def run_attributes(run: Any, holder: str | None, token: int | None) -> dict[str, Any]:
    """The attributes every span of a run's pass carries."""
    attributes: dict[str, Any] = {
        "pikku.run.id": str(run.pk),
        "pikku.workflow": run.workflow,
        "messaging.destination.name": run.queue,
    }
    if holder is not None:
        attributes["pikku.holder"] = holder
    if token is not None:
        attributes["pikku.lease.token"] = token
    return attributes


@contextmanager
def enqueue_span(workflow: str, queue: str) -> Iterator[tuple[Span, dict[str, str]]]:
    """
    The PRODUCER span of a start, current while the run is created: the
    span and the trace context to store on the run (empty when no span is
    recorded).
    """
    attributes = {"pikku.workflow": workflow, "messaging.destination.name": queue}
    with _tracer().start_as_current_span(
        f"pikku enqueue {workflow}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        yield span, carrier


def started(span: Span, run: Any) -> None:
    """The enqueue ``span``'s run was created: name it."""
    span.set_attribute("pikku.run.id", str(run.pk))


def _enqueued(run: Any) -> Context | None:
    """The enqueue span's context, from the one stored on ``run``; None when none was."""
    carrier = run.trace_context
    if not isinstance(carrier, dict) or not carrier:
        return None
    return propagate.extract(carrier)


@contextmanager
def pass_span(run: Any, holder: str | None, token: int | None) -> Iterator[None]:
    """A pass of ``run``: CONSUMER, a child of its enqueue span when one was stored."""
    with _tracer().start_as_current_span(
        f"pikku pass {run.workflow}",
        context=_enqueued(run),
        kind=SpanKind.CONSUMER,
        attributes=run_attributes(run, holder, token),
    ):
        yield


@contextmanager
def attempt_span(
    run: Any, step_name: str, attempt: int, holder: str | None, token: int | None
) -> Iterator[None]:
    """
    An attempt of a step: the first a child of the run's enqueue span, a
    later one a child of its pass, linked to the enqueue span.
    """
    enqueued = _enqueued(run)
    attributes = {
        **run_attributes(run, holder, token),
        "pikku.step.name": step_name,
        "pikku.step.attempt": attempt,
    }
    name = f"pikku step {step_name}"
    if enqueued is not None and attempt == 1:
        span = _tracer().start_as_current_span(name, context=enqueued, attributes=attributes)
    else:
        links = []
        if enqueued is not None:
            links.append(Link(trace.get_current_span(enqueued).get_span_context()))
        span = _tracer().start_as_current_span(name, links=links, attributes=attributes)
    with span:
        yield


def worker_lost_event(run: Any, step_name: str, attempt: int, holder: str) -> None:
    """A step of ``run`` taken over from the lost worker ``holder``: an event on the current span."""
    trace.get_current_span().add_event(
        "pikku.worker_lost",
        {
            "pikku.run.id": str(run.pk),
            "pikku.step.name": step_name,
            "pikku.step.attempt": attempt,
            "pikku.holder": holder,
        },
    )
