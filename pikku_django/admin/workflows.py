"""
The workflows page ("Workflows" on the admin index): one row per workflow
name (a Django task under its dotted path) with an outcome kept in the
per-minute rollup, its runs completed and failed and its start delay over
the last hour and the last day, with their charts. Read from the rollup
alone: the page costs the same queries however many runs there are.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Max, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from pikku_django.admin.base import ReadOnlyAdmin
from pikku_django.admin.chart_data import Series, one_read_per_page, series_of
from pikku_django.admin.charts import charts, summary
from pikku_django.admin.refresh import RefreshMixin
from pikku_django.managers.base import write_alias
from pikku_django.models import WorkflowMinute, WorkflowOverview
from pikku_django.workflows.registry import registered


@admin.register(WorkflowOverview)
class WorkflowOverviewAdmin(RefreshMixin, ReadOnlyAdmin):
    list_display = ["name", "last_hour", "last_day"]
    list_display_links = None
    search_fields = ["workflow"]
    ordering = ["workflow"]
    fields = ["name", "last_hour", "last_day"]
    readonly_fields = ["name", "last_hour", "last_day"]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The rows' charts are read once for the page, while it renders.
        with one_read_per_page():
            response = super().changelist_view(request, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowOverview]:
        # One row per name: its newest minute stands for the rest.
        rows: QuerySet[WorkflowOverview] = super().get_queryset(request)
        minutes = WorkflowMinute.objects.using(rows.db).order_by().values("workflow")
        return rows.filter(pk__in=minutes.annotate(newest=Max("pk")).values("newest"))

    @admin.display(description="workflow or task", ordering="workflow")
    def name(self, obj: WorkflowOverview) -> str:
        if obj.workflow not in registered():
            return obj.workflow
        url = reverse("admin:pikku_django_workflowrun_changelist")
        return format_html('<a href="{}?{}">{}</a>', url, urlencode({"workflow": obj.workflow}), obj.workflow)

    @admin.display(description="last hour")
    def last_hour(self, obj: WorkflowOverview) -> str:
        hour, _ = self._series(obj)
        return _cell(hour)

    @admin.display(description="last day")
    def last_day(self, obj: WorkflowOverview) -> str:
        _, day = self._series(obj)
        return _cell(day)

    def _series(self, obj: WorkflowOverview) -> list[Series]:
        return series_of(obj._state.db or write_alias(WorkflowMinute, None), "workflow", obj.workflow)


def _cell(series: Series) -> str:
    """A span's figures in words, then its charts."""
    return format_html(
        "{} completed, {} failed; start delay {}{}",
        series.completed,
        series.failed,
        summary(series),
        charts([series]),
    )
