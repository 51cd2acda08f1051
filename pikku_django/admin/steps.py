"""The workflow step admin: its attempts inline; step columns shared with the run page."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from pikku_django.admin.base import (
    ReadOnlyAdmin,
    ReadOnlyTabularInline,
    db_now_ms,
    format_ms,
    pretty_json,
    short_uuid,
)
from pikku_django.admin.operate import CappedFormSet, fork_button
from pikku_django.clock import DbNowMs
from pikku_django.models import StepStatus, WorkflowStep, WorkflowStepAttempt


class StepColumns(admin.options.BaseModelAdmin):  # type: ignore[type-arg]
    """Columns a step shows wherever it is listed: the run's page and the step list."""

    @admin.display(description="attempt")
    def attempt_display(self, obj: WorkflowStep) -> str:
        return f"{obj.attempt} / {obj.attempts_allowed}"

    @admin.display(description="lease left", ordering="lease_expires_at")
    def lease_left(self, obj: WorkflowStep) -> str:
        """Time left on a running step's lease, on the DB clock; "parked" for a NULL lease."""
        if obj.status != StepStatus.RUNNING:
            return self.get_empty_value_display()
        if obj.lease_expires_at is None:
            return "parked"
        left = obj.lease_expires_at - db_now_ms(obj)
        return format_ms(left) if left > 0 else "lapsed"


def attempt_lost(attempt: WorkflowStepAttempt, now_ms: int) -> bool:
    """Did ``attempt``, written as running, lose its worker (on the database clock ``now_ms``)?"""
    step = attempt.step
    if attempt.attempt < step.attempt:
        return True
    lease = step.lease_expires_at
    return step.status == StepStatus.RUNNING and lease is not None and lease <= now_ms


class WorkflowStepInline(StepColumns, ReadOnlyTabularInline):
    """A run's steps, the first ``INLINE_ROWS`` of them, each with a fork button."""

    model = WorkflowStep
    # child_run points at WorkflowRun too.
    fk_name = "run"
    formset = CappedFormSet
    fields = ["step_name", "status", "attempt_display", "lease_left", "rpc_name", "updated_at", "fork"]
    readonly_fields = ["attempt_display", "lease_left", "fork"]
    ordering = ["created_at"]
    show_change_link = True

    @admin.display(description="fork")
    def fork(self, obj: WorkflowStep) -> str:
        return fork_button(obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStep]:
        steps: QuerySet[WorkflowStep] = super().get_queryset(request)
        return steps.annotate(db_now_ms=DbNowMs())


class WorkflowStepAttemptInline(ReadOnlyTabularInline):
    model = WorkflowStepAttempt
    fields = [
        "attempt",
        "status_display",
        "holder",
        "result_display",
        "error_message",
        "created_at",
        "running_at",
        "succeeded_at",
        "failed_at",
        "delay_before_next",
    ]
    readonly_fields = ["status_display", "result_display", "error_message", "delay_before_next"]
    # Not the model's ("step", "attempt"): ordering by the FK would join the step table.
    ordering = ["attempt"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStepAttempt]:
        attempts: QuerySet[WorkflowStepAttempt] = super().get_queryset(request)
        # The next attempt's start, for the delay a failure was followed by.
        after = WorkflowStepAttempt.objects.filter(
            step_id=OuterRef("step_id"), attempt=OuterRef("attempt") + 1
        )
        return attempts.select_related("step").annotate(
            db_now_ms=DbNowMs(), next_running_at=Subquery(after.values("running_at")[:1])
        )

    @admin.display(description="status")
    def status_display(self, obj: WorkflowStepAttempt) -> str:
        """
        "lost worker" for an attempt still written as running whose worker is
        gone: a later attempt took the step, or its step lease lapsed.
        """
        if obj.status == StepStatus.RUNNING and attempt_lost(obj, db_now_ms(obj)):
            return "lost worker"
        return str(obj.get_status_display())

    @admin.display(description="result")
    def result_display(self, obj: WorkflowStepAttempt) -> str:
        return pretty_json(obj.result, self.get_empty_value_display())

    @admin.display(description="delay before the next")
    def delay_before_next(self, obj: WorkflowStepAttempt) -> str:
        """
        A failed attempt's wait before the next attempt started (its backoff
        or retry delay, and the time to a free worker), or the delay the
        next one is due after while it waits.
        """
        if obj.status != StepStatus.FAILED or obj.failed_at is None:
            return self.get_empty_value_display()
        started = getattr(obj, "next_running_at", None)
        if started is not None:
            return format_ms(max(int((started - obj.failed_at).total_seconds() * 1000), 0))
        step = obj.step
        if step.attempt == obj.attempt and step.status == StepStatus.FAILED and not step.is_exhausted:
            return f"due {format_ms(step.retry_delay or 0)} after it"
        return self.get_empty_value_display()

    @admin.display(description="error")
    def error_message(self, obj: WorkflowStepAttempt) -> str:
        """The message of the recorded exception (the step's page has the whole error)."""
        if obj.error is None:
            return self.get_empty_value_display()
        if isinstance(obj.error, dict) and "message" in obj.error:
            return str(obj.error["message"])
        return json.dumps(obj.error, ensure_ascii=False)


@admin.register(WorkflowStep)
class WorkflowStepAdmin(StepColumns, ReadOnlyAdmin):
    list_display = [
        "step_name",
        "run_link",
        "status",
        "attempt_display",
        "lease_left",
        "rpc_name",
        "updated_at",
    ]
    list_filter = ["status"]
    search_fields = ["step_name", "rpc_name", "run__id"]
    list_select_related = ["run"]
    fields = [
        "id",
        "run_link",
        "step_name",
        "rpc_name",
        "status",
        "attempt_display",
        "lease_left",
        "retry_delay",
        "child_run",
        "created_at",
        "updated_at",
        "data_json",
        "result_json",
        "error_json",
    ]
    readonly_fields = ["run_link", "attempt_display", "lease_left", "data_json", "result_json", "error_json"]
    inlines = [WorkflowStepAttemptInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStep]:
        steps: QuerySet[WorkflowStep] = super().get_queryset(request)
        return steps.annotate(db_now_ms=DbNowMs())

    @admin.display(description="run", ordering="run__created_at")
    def run_link(self, obj: WorkflowStep) -> str:
        url = reverse("admin:pikku_django_workflowrun_change", args=[obj.run_id])
        return format_html('<a href="{}">{} {}</a>', url, obj.run.workflow, short_uuid(obj.run_id))

    @admin.display(description="data")
    def data_json(self, obj: WorkflowStep) -> str:
        return pretty_json(obj.data, self.get_empty_value_display())

    @admin.display(description="result")
    def result_json(self, obj: WorkflowStep) -> str:
        return pretty_json(obj.result, self.get_empty_value_display())

    @admin.display(description="error")
    def error_json(self, obj: WorkflowStep) -> str:
        return pretty_json(obj.error, self.get_empty_value_display())
