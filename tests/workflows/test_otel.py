"""
OpenTelemetry (the ``otel`` extra), read by the SDK's in-memory exporter:
enqueue (PRODUCER, a child of the caller's span, its context stored on the
run) → pass (CONSUMER) → attempt, the first attempt a child of the enqueue
span and a retry linked to it, not its child; a lost worker an event.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.test import TransactionTestCase
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.worker import Worker
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.factories import lapse_step

PLAIN_STEP = "testproject.testing.workflows.plain_step"

#: One provider per process (OpenTelemetry lets it be set once).
EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)


def spans(name_start: str) -> list[ReadableSpan]:
    return [span for span in EXPORTER.get_finished_spans() if span.name.startswith(name_start)]


def only(found: list[ReadableSpan]) -> ReadableSpan:
    assert len(found) == 1, [span.name for span in found]
    return found[0]


class OpenTelemetryTests(TransactionTestCase):
    def setUp(self) -> None:
        EXPORTER.clear()

    def test_enqueue_pass_and_attempts_with_a_retry_linked(self) -> None:
        missing = str(Path(tempfile.mkdtemp()) / "never")
        tracer = trace.get_tracer("the-caller")
        with tracer.start_as_current_span("request") as request:
            run = start_workflow("test.fragile", {"path": missing}, queue="emails")
        enqueue = only(spans("pikku enqueue"))
        assert enqueue.kind == SpanKind.PRODUCER
        assert enqueue.parent is not None and enqueue.parent.span_id == request.get_span_context().span_id
        assert enqueue.attributes is not None
        assert enqueue.attributes["pikku.run.id"] == str(run.pk)
        assert enqueue.attributes["messaging.destination.name"] == "emails"
        stored = WorkflowRun.objects.get(pk=run.pk).trace_context
        assert stored is not None and f"{enqueue.context.span_id:016x}" in stored["traceparent"]

        assert run_workflow(run.pk).status == "failed"
        the_pass = only(spans("pikku pass"))
        assert the_pass.kind == SpanKind.CONSUMER
        assert the_pass.parent is not None and the_pass.parent.span_id == enqueue.context.span_id
        assert the_pass.context.trace_id == enqueue.context.trace_id
        attributes = dict(the_pass.attributes or {})
        assert attributes["pikku.run.id"] == str(run.pk)
        assert attributes["pikku.workflow"] == "test.fragile"
        assert attributes["messaging.destination.name"] == "emails"
        assert attributes["pikku.holder"] and attributes["pikku.lease.token"] >= 1

        fragile = sorted(spans("pikku step fragile"), key=lambda span: span.start_time or 0)
        first, retry = fragile
        assert dict(first.attributes or {})["pikku.step.attempt"] == 1
        assert dict(retry.attributes or {})["pikku.step.attempt"] == 2
        assert dict(retry.attributes or {})["pikku.step.name"] == "fragile"
        # The first attempt a child of the enqueue span; the retry linked to it, not its child.
        assert first.parent is not None and first.parent.span_id == enqueue.context.span_id
        assert retry.parent is not None and retry.parent.span_id == the_pass.context.span_id
        assert [link.context.span_id for link in retry.links] == [enqueue.context.span_id]

    def test_a_workers_first_attempt_is_a_child_of_the_enqueue_span(self) -> None:
        # Taken by a worker's lane (its take returns the run and its stored context), not run inline.
        run = start_workflow("test.steps", {"steps": 2})
        enqueue = only(spans("pikku enqueue"))
        assert Worker(holder="w-otel", once=True).run() == 1
        the_pass = only(spans("pikku pass"))
        assert the_pass.parent is not None and the_pass.parent.span_id == enqueue.context.span_id
        steps = spans("pikku step")
        assert len(steps) == 2
        for step in steps:
            assert dict(step.attributes or {})["pikku.step.attempt"] == 1
            assert dict(step.attributes or {})["pikku.run.id"] == str(run.pk)
            assert step.parent is not None and step.parent.span_id == enqueue.context.span_id
            assert step.context.trace_id == enqueue.context.trace_id and not step.links

    def test_a_lost_worker_is_an_event(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        step = WorkflowStep.objects.insert_step(run, "s0", PLAIN_STEP, retries=2)
        WorkflowStep.objects.claim(run.pk, "s0", PLAIN_STEP, 60_000, holder="gone-worker")
        lapse_step(step)
        assert run_workflow(run.pk).status == "completed"
        events = [event for event in only(spans("pikku pass")).events if event.name == "pikku.worker_lost"]
        assert len(events) == 1
        assert dict(events[0].attributes or {})["pikku.holder"] == "gone-worker"
        assert dict(events[0].attributes or {})["pikku.step.attempt"] == 2
