"""The workflow run admin: its steps inline, a timeline, wake, cancel and retry actions, fork."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.urls.resolvers import URLPattern
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from pikku_django.admin.base import (
    ReadOnlyAdmin,
    db_now_ms,
    format_ms,
    has_change_perm,
    pretty_json,
    short_uuid,
)
from pikku_django.admin.deploys import CodeVersionFilter, PatchFilter, patch_names
from pikku_django.admin.events import describe_events
from pikku_django.admin.fanout import ItemsFilter, fan_out_lines
from pikku_django.admin.flow import describe_flow
from pikku_django.admin.operate import (
    INLINE_ROWS,
    RunStatusFilter,
    fork_view,
    full_list_link,
    retry_selected,
)
from pikku_django.admin.refresh import RefreshMixin
from pikku_django.admin.run_page import (
    PAGE_REQUEST,
    LevelFilter,
    cancel_view,
    coloured_status,
    error_last_line,
    readable_error,
    retry_view,
    run_buttons,
    shown_fields,
)
from pikku_django.admin.run_search import WorkflowFilter, search_runs
from pikku_django.admin.steps import WorkflowStepInline
from pikku_django.admin.timeline import run_timeline
from pikku_django.admin.waits import WorkflowSignalInline, describe_wait, waiting_annotations
from pikku_django.clock import DbNowMs, EpochMs
from pikku_django.managers import WorkflowRunQuerySet
from pikku_django.managers.held import is_held_annotation, shown_status
from pikku_django.models import StepStatus, WorkflowRun, WorkflowStep


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


@admin.register(WorkflowRun)
class WorkflowRunAdmin(RefreshMixin, ReadOnlyAdmin):
    list_display = [
        "short_id",
        "name_display",
        "status_display",
        "error_display",
        "queue",
        "steps_display",
        "age",
        "waits_for",
        "priority",
    ]
    list_display_links = ["short_id"]
    list_filter = [RunStatusFilter, WorkflowFilter, LevelFilter, ItemsFilter, CodeVersionFilter, PatchFilter]
    # Searched by search_runs (exact names and keys, id prefixes as ranges).
    search_fields = ["id", "workflow", "idempotency_key"]
    search_help_text = "A run id (or its first characters), a workflow name, or an idempotency key."
    fields = [
        "summary",
        "timeline",
        "id",
        "workflow",
        "status_display",
        "queue",
        "priority",
        "steps_display",
        "waiting_display",
        "flow_display",
        "wake_display",
        "deadline_display",
        "parent_display",
        "children_display",
        "idempotency_key",
        "key",
        "dedup_key",
        "forked_from",
        "code_version",
        "driven_version",
        "patches_display",
        "created_at",
        "age",
        "updated_at",
        "input_json",
        "output_json",
        "error_json",
        "events_display",
        "more_rows",
    ]
    readonly_fields = [
        "summary",
        "name_display",
        "status_display",
        "error_display",
        "timeline",
        "more_rows",
        "steps_display",
        "age",
        "wake_display",
        "waiting_display",
        "flow_display",
        "deadline_display",
        "parent_display",
        "children_display",
        "input_json",
        "output_json",
        "error_json",
        "patches_display",
        "events_display",
    ]
    inlines = [WorkflowStepInline, WorkflowSignalInline]
    actions = ["wake_runs", "cancel_runs", "retry_runs"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # The DB clock's now rides on each row, so "due" is judged where
        # wake_at is (see LeaseAdmin); the step counts are two correlated
        # subqueries, so the page costs the same however many runs it shows.
        runs: QuerySet[WorkflowRun] = super().get_queryset(request)
        return runs.annotate(
            db_now_ms=DbNowMs(),
            created_ms=EpochMs("created_at"),
            steps_total=step_counts(),
            steps_done=step_counts(StepStatus.SUCCEEDED),
            is_held=is_held_annotation(),
            **waiting_annotations(),
        )

    def get_fields(self, request: HttpRequest, obj: WorkflowRun | None = None) -> Any:
        return shown_fields([str(name) for name in super().get_fields(request, obj)], obj)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], search_term: str
    ) -> tuple[QuerySet[WorkflowRun], bool]:
        return search_runs(queryset, search_term), False

    @admin.display(description="holds patches")
    def patches_display(self, obj: WorkflowRun) -> str:
        return patch_names(obj) or self.get_empty_value_display()

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # The page's buttons ask whether this request may operate the run.
        token = PAGE_REQUEST.set(request)
        try:
            response = super().change_view(request, object_id, form_url, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()
            return response
        finally:
            PAGE_REQUEST.reset(token)

    @admin.display(description="summary")
    def summary(self, obj: WorkflowRun) -> str:
        """What a run's page leads with: status, name, queue, age, the error's last line; its buttons."""
        error = error_last_line(obj.error)
        return format_html(
            '{} · <strong>{}</strong> · queue {} · {} old{}<div style="margin-top: .5em">{}</div>',
            coloured_status(shown_status(obj)),
            obj.display_name,
            obj.queue,
            self.age(obj),
            format_html(' · <code style="color: #c62828">{}</code>', error) if error else "",
            run_buttons(obj),
        )

    @admin.display(description="workflow or task", ordering="workflow")
    def name_display(self, obj: WorkflowRun) -> str:
        """Its name, wrapping anywhere (a long dotted path); under a child's or an item's, its parent."""
        name = format_html('<span style="overflow-wrap: anywhere">{}</span>', obj.display_name)
        if obj.parent_id is None:
            return name
        return format_html("{}<br><small>of {}</small>", name, self.parent_display(obj))

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: WorkflowRun) -> str:
        return coloured_status(shown_status(obj))

    @admin.display(description="error")
    def error_display(self, obj: WorkflowRun) -> str:
        line = error_last_line(obj.error)
        if not line:
            return self.get_empty_value_display()
        return format_html('<span title="{}">{}</span>', line, line if len(line) <= 80 else line[:79] + "…")

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: WorkflowRun) -> str:
        return short_uuid(obj.pk)

    @admin.display(description="steps")
    def steps_display(self, obj: WorkflowRun) -> str:
        done = getattr(obj, "steps_done", None)
        total = getattr(obj, "steps_total", None)
        if done is None or total is None:
            steps = obj.steps.all()
            done, total = steps.filter(status=StepStatus.SUCCEEDED).count(), steps.count()
        return f"{done} / {total}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: WorkflowRun) -> str:
        # In epoch ms on the database clock, so USE_TZ = False reads right too.
        created = getattr(obj, "created_ms", None)
        if created is None:
            return format_ms(max(0, int((timezone.now() - obj.created_at).total_seconds() * 1000)))
        return format_ms(max(0, db_now_ms(obj) - int(created)))

    @admin.display(description="wake", ordering="wake_at")
    def wake_display(self, obj: WorkflowRun) -> str:
        """``due`` once ``wake_at`` has come on the DB clock, else how long until it does."""
        if obj.wake_at is None:
            return self.get_empty_value_display()
        left = obj.wake_at - db_now_ms(obj)
        return f"in {format_ms(left)}" if left > 0 else "due"

    @admin.display(description="waiting")
    def waiting_display(self, obj: WorkflowRun) -> str:
        """Why the run waits: sleeping until …, waiting for signal "x" since …, waiting for child …."""
        return describe_wait(obj, db_now_ms(obj)) or self.get_empty_value_display()

    @admin.display(description="waiting", ordering="wake_at")
    def waits_for(self, obj: WorkflowRun) -> str:
        """In the list, what the run waits for; else when it wakes ("due", or "in 12 s" for a backoff)."""
        return describe_wait(obj, db_now_ms(obj)) or self.wake_display(obj)

    @admin.display(description="flow control")
    def flow_display(self, obj: WorkflowRun) -> str:
        """Why flow control holds the run: debounced or rate-limited until …, its key's slots in use."""
        return describe_flow(obj, db_now_ms(obj)) or self.get_empty_value_display()

    @admin.display(description="parent", ordering="parent")
    def parent_display(self, obj: WorkflowRun) -> str:
        if obj.parent_id is None:
            return self.get_empty_value_display()
        url = reverse("admin:pikku_django_workflowrun_change", args=[obj.parent_id])
        return format_html('<a href="{}">{}</a>', url, short_uuid(obj.parent_id))

    @admin.display(description="children")
    def children_display(self, obj: WorkflowRun) -> str:
        """Its ctx.workflow children one per line; each fan-out as one line of counts (``admin.fanout``)."""
        children = list(
            obj.children.filter(parent_step__isnull=True)
            .order_by("created_at")
            .values_list("pk", "workflow", "status")[: INLINE_ROWS + 1]
        )
        fan_outs = fan_out_lines(obj)
        if not children and not fan_outs:
            return self.get_empty_value_display()
        links = fan_outs + [
            format_html(
                '<a href="{}">{}</a> {} ({})',
                reverse("admin:pikku_django_workflowrun_change", args=[pk]),
                short_uuid(pk),
                workflow,
                status,
            )
            for pk, workflow, status in children[:INLINE_ROWS]
        ]
        if len(children) > INLINE_ROWS:
            links.append(format_html("… and more (the first {} are shown)", INLINE_ROWS))
        return format_html_join(mark_safe("<br>"), "{}", ((link,) for link in links))

    @admin.display(description="deadline", ordering="deadline_at")
    def deadline_display(self, obj: WorkflowRun) -> str:
        if obj.deadline is None:
            return self.get_empty_value_display()
        left = (obj.deadline_at or 0) - db_now_ms(obj)
        when = obj.deadline.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{when} (in {format_ms(left)})" if left > 0 and not obj.is_finished else when

    @admin.display(description="input")
    def input_json(self, obj: WorkflowRun) -> str:
        return pretty_json(obj.input, self.get_empty_value_display())

    @admin.display(description="output")
    def output_json(self, obj: WorkflowRun) -> str:
        return pretty_json(obj.output, self.get_empty_value_display())

    @admin.display(description="error")
    def error_json(self, obj: WorkflowRun) -> str:
        return readable_error(obj.error, self.get_empty_value_display())

    @admin.display(description="events and streams")
    def events_display(self, obj: WorkflowRun) -> str:
        return describe_events(obj, self.get_empty_value_display())

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

    @admin.action(description="Retry selected runs", permissions=["retry"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        # Failed and cancelled runs (task runs too) go on from where they stopped.
        retry_selected(self, request, queryset)

    @admin.display(description="timeline")
    def timeline(self, obj: WorkflowRun) -> str:
        return run_timeline(obj)

    @admin.display(description="more rows")
    def more_rows(self, obj: WorkflowRun) -> str:
        """Links to the whole step and signal lists when the inlines show only the first rows."""
        steps = obj.steps.count()
        signals = obj.signals.count()
        links = [
            full_list_link("admin:pikku_django_workflowstep_changelist", obj, steps, "steps")
            if steps > INLINE_ROWS
            else None,
            full_list_link("admin:pikku_django_workflowsignal_changelist", obj, signals, "signals")
            if signals > INLINE_ROWS
            else None,
        ]
        shown = [link for link in links if link]
        if not shown:
            return self.get_empty_value_display()
        return format_html_join(mark_safe("<br>"), "{}", ((link,) for link in shown))

    def get_urls(self) -> list[URLPattern]:
        fork = path(
            "<path:object_id>/fork/",
            self.admin_site.admin_view(fork_view),
            name="pikku_django_workflowrun_fork",
        )
        retry = path(
            "<path:object_id>/retry/",
            self.admin_site.admin_view(retry_view),
            name="pikku_django_workflowrun_retry",
        )
        cancel = path(
            "<path:object_id>/cancel/",
            self.admin_site.admin_view(cancel_view),
            name="pikku_django_workflowrun_cancel",
        )
        return [fork, retry, cancel, *super().get_urls()]

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowRun)

    def has_wake_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowRun)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowRun)
