"""
The queues page ("Queues" on the admin index): per queue its runs by status,
the due backlog and its oldest run's age on the database clock, slots used
of its limit, its busiest keys, and its charts (the last hour on its row,
the last day too on its page); pause, resume and drain.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from pikku_django.admin.base import ReadOnlyAdmin, format_ms, has_change_perm
from pikku_django.admin.chart_data import one_read_per_page, page_cached, series_of
from pikku_django.admin.charts import charts
from pikku_django.admin.refresh import RefreshMixin
from pikku_django.conf import conf
from pikku_django.managers.base import write_alias
from pikku_django.managers.queues import (
    QUEUE_STATUSES,
    WorkflowQueueQuerySet,
    busiest_keys,
    slots_in_use,
)
from pikku_django.models import WorkflowQueue
from pikku_django.store.queues import drain_queue, set_paused, sync_queues


@admin.register(WorkflowQueue)
class WorkflowQueueAdmin(RefreshMixin, ReadOnlyAdmin):
    list_display = ["name", "state", "runs_by_status", "due", "oldest_due", "slots", "busiest", "last_hour"]
    search_fields = ["name"]
    fields = [
        "name",
        "state",
        "runs_by_status",
        "due",
        "oldest_due",
        "slots",
        "busiest",
        "charts_display",
        "changed_at",
    ]
    readonly_fields = ["state", "runs_by_status", "due", "oldest_due", "slots", "busiest", "charts_display"]
    actions = ["pause_queues", "resume_queues", "drain_queues"]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Every queue that has runs or is configured is listed: its row is made here.
        sync_queues(using=write_alias(WorkflowQueue, None))
        # The rows' keys and charts are read once for the page, while it renders.
        with one_read_per_page():
            response = super().changelist_view(request, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowQueue]:
        # The figures ride on each row (correlated subqueries) and the slots
        # in use come from one read of the slot leases: the page costs the
        # same number of queries however many runs there are.
        rows = super().get_queryset(request)
        assert isinstance(rows, WorkflowQueueQuerySet)
        used = slots_in_use(rows.db)
        slots = Case(
            *[When(name=name, then=Value(count)) for name, count in used.items()],
            default=Value(0),
            output_field=IntegerField(),
        )
        return rows.with_stats().annotate(slots_used=slots)

    @admin.display(description="state", ordering="paused")
    def state(self, obj: WorkflowQueue) -> str:
        if obj.paused:
            return format_html('<strong style="color: #ba2121">{}</strong>', "paused")
        return "active"

    @admin.display(description="runs by status")
    def runs_by_status(self, obj: WorkflowQueue) -> str:
        # The statuses the queue has runs of, one per line; none at all as "-".
        url = reverse("admin:pikku_django_workflowrun_changelist")
        link = '<a href="{}?queue={}&status={}">{} {}</a>'
        counts = [(status, getattr(obj, f"runs_{status}", 0)) for status in QUEUE_STATUSES]
        parts = [format_html(link, url, obj.name, status, count, status) for status, count in counts if count]
        if not parts:
            return self.get_empty_value_display()
        return format_html("<br>".join(["{}"] * len(parts)), *parts)

    @admin.display(description="due")
    def due(self, obj: WorkflowQueue) -> int:
        return int(getattr(obj, "due", 0))

    @admin.display(description="oldest due")
    def oldest_due(self, obj: WorkflowQueue) -> str:
        """How long the oldest due run has been due, on the database clock."""
        oldest = getattr(obj, "oldest_due_at", None)
        if oldest is None:
            return self.get_empty_value_display()
        return format_ms(max(0, int(obj.db_now_ms) - int(oldest)))  # type: ignore[attr-defined]

    @admin.display(description="slots used / limit")
    def slots(self, obj: WorkflowQueue) -> str:
        limit = conf.concurrency(obj.name)
        used = int(getattr(obj, "slots_used", 0))
        return f"{used} / {'∞' if limit is None else limit}"

    @admin.display(description="busiest keys")
    def busiest(self, obj: WorkflowQueue) -> str:
        """The keys with the most runs running or due, each linked to its runs."""
        alias = obj._state.db or write_alias(WorkflowQueue, None)
        keys = page_cached(
            ("keys", alias), lambda every: busiest_keys(alias, None if every else [obj.name])
        ).get(obj.name)
        if not keys:
            return self.get_empty_value_display()
        url = reverse("admin:pikku_django_workflowrun_changelist")
        return format_html_join(
            ", ",
            '<a href="{}?{}">{}</a> ({})',
            (
                (url, urlencode({"queue": obj.name, "status": "running", "key": key}), key, n)
                for key, n in keys
            ),
        )

    @admin.display(description="last hour")
    def last_hour(self, obj: WorkflowQueue) -> str:
        hour, _ = series_of(obj._state.db or write_alias(WorkflowQueue, None), "queue", obj.name)
        return charts([hour])

    @admin.display(description="charts")
    def charts_display(self, obj: WorkflowQueue) -> str:
        return charts(series_of(obj._state.db or write_alias(WorkflowQueue, None), "queue", obj.name))

    @admin.action(description="Pause selected queues", permissions=["operate"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[WorkflowQueue]) -> None:
        self._set(request, queryset, paused=True)

    @admin.action(description="Resume selected queues", permissions=["operate"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[WorkflowQueue]) -> None:
        self._set(request, queryset, paused=False)

    @admin.action(description="Drain selected queues (cancel their due runs)", permissions=["operate"])
    def drain_queues(self, request: HttpRequest, queryset: QuerySet[WorkflowQueue]) -> None:
        alias = write_alias(WorkflowQueue, queryset._db)  # type: ignore[attr-defined]
        names = list(queryset.values_list("name", flat=True))
        cancelled = sum(drain_queue(name, using=alias) for name in names)
        level = messages.SUCCESS if cancelled else messages.WARNING
        self.message_user(request, f"Cancelled {cancelled} due run(s) of {len(names)} queue(s).", level)

    def _set(self, request: HttpRequest, queryset: QuerySet[WorkflowQueue], *, paused: bool) -> None:
        alias = write_alias(WorkflowQueue, queryset._db)  # type: ignore[attr-defined]
        names = list(queryset.values_list("name", flat=True))
        changed = sum(set_paused(name, paused, using=alias) for name in names)
        verb = "Paused" if paused else "Resumed"
        message = f"{verb} {changed} queue{'s' if changed != 1 else ''}."
        if len(names) > changed:
            message += f" Skipped {len(names) - changed} {'paused' if paused else 'not paused'} already."
        self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowQueue)
