"""Read-only admin for leases and for workflow runs, steps and attempts."""

from __future__ import annotations

import datetime
import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.db import models
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from pikku_django.clock import DbNowMs
from pikku_django.managers import LeaseQuerySet, WorkflowRunQuerySet
from pikku_django.models import Lease, StepStatus, WorkflowRun, WorkflowStep, WorkflowStepAttempt


def format_ms(ms: int) -> str:
    """A short human duration: ``950 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 3 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class ReadOnlyMixin:
    """Rows written by workers: viewable, never added, edited or deleted by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = self.model._meta.fields  # type: ignore[attr-defined]
        return [field.name for field in fields] + list(self.readonly_fields)  # type: ignore[attr-defined]


class ReadOnlyAdmin(ReadOnlyMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin for rows written by workers."""


class LeaseStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "Live"), ("lapsed", "Lapsed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "live":
            return queryset.filter(expires_at__gt=DbNowMs())
        if self.value() == "lapsed":
            return queryset.filter(expires_at__lte=DbNowMs())
        return None


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["key", "holder", "token", "expires_display", "state", "time_left"]
    list_filter = [LeaseStateFilter]
    search_fields = ["key", "holder"]
    ordering = ["key"]
    readonly_fields = ["expires_display", "state", "time_left"]
    actions = ["expire_leases"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        # Each row carries the database clock's now, so "live" and "time left"
        # are judged on the clock leases are judged on, not the web server's.
        leases: QuerySet[Lease] = super().get_queryset(request)
        return leases.annotate(db_now_ms=DbNowMs())

    def _left_ms(self, obj: Lease) -> int:
        now = getattr(obj, "db_now_ms", None)
        if now is None:
            now = Lease.objects.db_manager(obj._state.db).db_now_ms()
        return int(obj.expires_at) - int(now)

    @admin.display(description="expires", ordering="expires_at")
    def expires_display(self, obj: Lease) -> datetime.datetime:
        return obj.expires

    @admin.display(description="state", ordering="expires_at")
    def state(self, obj: Lease) -> str:
        return "live" if self._left_ms(obj) > 0 else "lapsed"

    @admin.display(description="time left", ordering="expires_at")
    def time_left(self, obj: Lease) -> str:
        left = self._left_ms(obj)
        return format_ms(left) if left > 0 else self.get_empty_value_display()

    @admin.action(description="Expire selected leases", permissions=["expire"])
    def expire_leases(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        # The tokens stay: a later holder still gets a higher one, and the old
        # holder's next renewal is refused.
        assert isinstance(queryset, LeaseQuerySet)
        count = queryset.expire()
        self.message_user(
            request,
            f"Expired {count} lease{'s' if count != 1 else ''}.",
            messages.SUCCESS if count else messages.WARNING,
        )

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("pikku_django.change_lease"))


# ---------------------------------------------------------------------------
# Workflow runs, steps and attempts
# ---------------------------------------------------------------------------


def short_uuid(pk: Any) -> str:
    """The first eight hex digits of a UUID: enough to tell runs apart on a page."""
    return str(pk)[:8]


def pretty_json(value: Any, empty: str) -> str:
    """A JSON value indented in a ``<pre>``, or ``empty`` for NULL."""
    if value is None:
        return empty
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def db_now_ms(obj: models.Model) -> int:
    """
    The database clock's now for ``obj``: the ``db_now_ms`` its queryset was
    annotated with, or (for an object fetched elsewhere) read from its database.
    """
    now = getattr(obj, "db_now_ms", None)
    if now is None:
        now = Lease.objects.db_manager(obj._state.db).db_now_ms()
    return int(now)


def has_change_perm(request: HttpRequest, model: type[models.Model]) -> bool:
    """Does the user hold the model's change permission (the admins here grant no editing)?"""
    opts = model._meta
    return bool(request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"))


def step_counts(status: str | None = None) -> Coalesce:
    """
    How many steps the outer run has (of ``status``, if given): one correlated
    COUNT, an index probe on ``run_id``. A subquery rather than ``Count("steps")``
    on the run query, which would join every step, GROUP BY every run column
    (the JSON ones too, on MariaDB) and count the steps of every run before the
    page is cut; and an action's UPDATE would inherit that join.
    """
    steps = WorkflowStep.objects.filter(run=OuterRef("pk"))
    condition = Q() if status is None else Q(status=status)
    counted = steps.order_by().values("run").annotate(n=Count("pk", filter=condition)).values("n")
    return Coalesce(Subquery(counted), 0)


class ReadOnlyTabularInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    """The inline twin of ``ReadOnlyAdmin``."""

    extra = 0
    can_delete = False


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


class WorkflowStepInline(StepColumns, ReadOnlyTabularInline):
    model = WorkflowStep
    # child_run points at WorkflowRun too.
    fk_name = "run"
    fields = ["step_name", "status", "attempt_display", "lease_left", "rpc_name", "updated_at"]
    readonly_fields = ["attempt_display", "lease_left"]
    ordering = ["created_at"]
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowStep]:
        steps: QuerySet[WorkflowStep] = super().get_queryset(request)
        return steps.annotate(db_now_ms=DbNowMs())


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    list_display = ["short_id", "workflow", "status", "steps_display", "age", "wake_display", "updated_at"]
    list_display_links = ["short_id"]
    list_filter = ["status", "workflow"]
    search_fields = ["id", "workflow"]
    fields = [
        "id",
        "workflow",
        "status",
        "steps_display",
        "wake_display",
        "created_at",
        "age",
        "updated_at",
        "input_json",
        "output_json",
        "error_json",
    ]
    readonly_fields = ["steps_display", "age", "wake_display", "input_json", "output_json", "error_json"]
    inlines = [WorkflowStepInline]
    actions = ["wake_runs", "cancel_runs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # The DB clock's now rides on each row, so "due" is judged where
        # wake_at is (see LeaseAdmin); the step counts are two correlated
        # subqueries, so the page costs the same however many runs it shows.
        runs: QuerySet[WorkflowRun] = super().get_queryset(request)
        return runs.annotate(
            db_now_ms=DbNowMs(),
            steps_total=step_counts(),
            steps_done=step_counts(StepStatus.SUCCEEDED),
        )

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: WorkflowRun) -> str:
        return short_uuid(obj.pk)

    @admin.display(description="steps done")
    def steps_display(self, obj: WorkflowRun) -> str:
        done = getattr(obj, "steps_done", None)
        total = getattr(obj, "steps_total", None)
        if done is None or total is None:
            steps = obj.steps.all()
            done, total = steps.filter(status=StepStatus.SUCCEEDED).count(), steps.count()
        return f"{done} / {total}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: WorkflowRun) -> str:
        elapsed = timezone.now() - obj.created_at
        return format_ms(max(0, int(elapsed.total_seconds() * 1000)))

    @admin.display(description="wake", ordering="wake_at")
    def wake_display(self, obj: WorkflowRun) -> str:
        """``due`` once ``wake_at`` has come on the DB clock, else how long until it does."""
        if obj.wake_at is None:
            return self.get_empty_value_display()
        left = obj.wake_at - db_now_ms(obj)
        return f"in {format_ms(left)}" if left > 0 else "due"

    @admin.display(description="input")
    def input_json(self, obj: WorkflowRun) -> str:
        return pretty_json(obj.input, self.get_empty_value_display())

    @admin.display(description="output")
    def output_json(self, obj: WorkflowRun) -> str:
        return pretty_json(obj.output, self.get_empty_value_display())

    @admin.display(description="error")
    def error_json(self, obj: WorkflowRun) -> str:
        return pretty_json(obj.error, self.get_empty_value_display())

    @admin.action(description="Wake selected runs", permissions=["wake"])
    def wake_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        # Only running runs wake (a worker then replays them); the annotations
        # are plain subqueries, so the UPDATE drops them and touches one table.
        assert isinstance(queryset, WorkflowRunQuerySet)
        selected = queryset.count()
        count = queryset.wake()
        self._report(request, "Woke", count, selected - count, "not running")

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        assert isinstance(queryset, WorkflowRunQuerySet)
        selected = queryset.count()
        count = queryset.cancel()
        self._report(request, "Cancelled", count, selected - count, "already finished")

    def _report(self, request: HttpRequest, verb: str, count: int, skipped: int, why: str) -> None:
        message = f"{verb} {count} run{'s' if count != 1 else ''}."
        if skipped:
            message += f" Skipped {skipped} {why}."
        self.message_user(request, message, messages.SUCCESS if count else messages.WARNING)

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowRun)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowRun)


class WorkflowStepAttemptInline(ReadOnlyTabularInline):
    model = WorkflowStepAttempt
    fields = [
        "attempt",
        "status",
        "result_display",
        "error_message",
        "created_at",
        "running_at",
        "succeeded_at",
        "failed_at",
    ]
    readonly_fields = ["result_display", "error_message"]
    # Not the model's ("step", "attempt"): ordering by the FK would join the step table.
    ordering = ["attempt"]

    @admin.display(description="result")
    def result_display(self, obj: WorkflowStepAttempt) -> str:
        return pretty_json(obj.result, self.get_empty_value_display())

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
