"""
The admin of a fan-out: a ``ctx.map`` or ``ctx.workflows`` step is one line
on its run's page, with its items' counts and a link to them, however many
items it has; and the run list's filter that the link opens.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from pikku_django.admin.base import short_uuid
from pikku_django.managers import ACTIVE_RUN_STATUSES
from pikku_django.models import WorkflowFanOut, WorkflowRun
from pikku_django.store.fanout import HELD


def item_counts(step_id: Any) -> dict[str, int]:
    """
    The items of one fan-out by state, in one aggregate over its items:
    pending (not released yet, or due and not begun), running, succeeded,
    failed (failed or cancelled).
    """
    items = WorkflowRun.objects.filter(parent_step_id=step_id)
    begun = Q(steps__isnull=False)
    counts = items.aggregate(
        held=Count("pk", filter=Q(status=HELD, wake_at__isnull=True), distinct=True),
        active=Count("pk", filter=Q(status__in=ACTIVE_RUN_STATUSES), distinct=True),
        begun=Count("pk", filter=Q(status__in=ACTIVE_RUN_STATUSES) & begun, distinct=True),
        succeeded=Count("pk", filter=Q(status="completed"), distinct=True),
        failed=Count("pk", filter=Q(status__in=("failed", "cancelled")), distinct=True),
    )
    return {
        "pending": counts["active"] - counts["begun"],
        "running": counts["begun"],
        "succeeded": counts["succeeded"],
        "failed": counts["failed"],
    }


def fan_out_lines(run: WorkflowRun) -> list[str]:
    """One line per fan-out step of ``run``: its kind, name, counts and a link to its items."""
    lines: list[str] = []
    fan_outs = WorkflowFanOut.objects.filter(step__run=run).select_related("step").order_by("step__pk")
    changelist = reverse("admin:pikku_django_workflowrun_changelist")
    for fan_out in fan_outs:
        counts = item_counts(fan_out.pk)
        url = f"{changelist}?{ItemsFilter.parameter_name}={fan_out.pk}"
        limit = "" if fan_out.max_parallel is None else f", at most {fan_out.max_parallel} at once"
        lines.append(
            format_html(
                '{} {}: <a href="{}">{} items</a>{} — {} pending · {} running · {} succeeded · {} failed{}',
                fan_out.get_kind_display(),
                fan_out.step.step_name,
                url,
                fan_out.total,
                limit,
                counts["pending"],
                counts["running"],
                counts["succeeded"],
                counts["failed"],
                " (halted)" if fan_out.halted else "",
            )
        )
    return lines


class ItemsFilter(admin.SimpleListFilter):
    """The items of one fan-out step (the run page's link); shown only while in use."""

    title = "fan-out"
    parameter_name = "parent_step"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = request.GET.get(self.parameter_name)
        return [(value, f"items of step {short_uuid(value)}")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        step_id: Any = self.value()
        if not step_id:
            return queryset
        return queryset.filter(parent_step_id=step_id).order_by("parent_index")
