"""The schedule admin: next tick on the DB clock, the last tick and its run; pause, resume, trigger now."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from pikku_django import schedules
from pikku_django.admin.base import (
    ReadOnlyAdmin,
    db_now_ms,
    format_ms,
    has_change_perm,
    pretty_json,
    short_uuid,
)
from pikku_django.managers.base import write_alias
from pikku_django.managers.schedules import WorkflowScheduleQuerySet
from pikku_django.models import WorkflowSchedule, WorkflowScheduleTick
from pikku_django.schedules.report import iso, next_ticks, state

#: How many ledger rows a schedule's page lists (the ledger's own page has them all).
LEDGER_ROWS = 20


def _run_link(run_id: object, status: object) -> str:
    url = reverse("admin:pikku_django_workflowrun_change", args=[run_id])
    return format_html('<a href="{}">{}</a> {}', url, short_uuid(run_id), status or "")


@admin.register(WorkflowSchedule)
class WorkflowScheduleAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "target",
        "cron",
        "timezone",
        "state_display",
        "next_tick",
        "last_tick",
        "catch_up",
        "overlap",
    ]
    list_filter = ["enabled", "paused"]
    search_fields = ["name"]
    fields = [
        "name",
        "target",
        "cron",
        "timezone",
        "state_display",
        "next_tick",
        "last_tick",
        "catch_up",
        "catch_up_window_ms",
        "overlap",
        "queue",
        "priority",
        "input_json",
        "ledger",
        "created_at",
        "updated_at",
    ]
    readonly_fields = ["target", "state_display", "next_tick", "last_tick", "input_json", "ledger"]
    actions = ["pause_schedules", "resume_schedules", "trigger_schedules"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowSchedule]:
        # The newest ledger row and the DB clock's now ride on each row (correlated
        # subqueries): the page costs the same however many schedules it lists.
        rows = super().get_queryset(request)
        assert isinstance(rows, WorkflowScheduleQuerySet)
        return rows.with_latest()

    @admin.display(description="state", ordering="paused")
    def state_display(self, obj: WorkflowSchedule) -> str:
        return state(obj)

    @admin.display(description="next tick")
    def next_tick(self, obj: WorkflowSchedule) -> str:
        """The next tick not yet recorded, and how far it is on the database clock."""
        upcoming = next_ticks(obj, 1)
        if not upcoming:
            return self.get_empty_value_display()
        left = upcoming[0] - db_now_ms(obj)
        when = str(iso(upcoming[0]))
        return f"{when} (in {format_ms(left)})" if left > 0 else f"{when} (due {format_ms(-left)} ago)"

    @admin.display(description="last tick")
    def last_tick(self, obj: WorkflowSchedule) -> str:
        at = getattr(obj, "latest_tick_at", None)
        if at is None:
            return self.get_empty_value_display()
        when = f"{iso(at)}{' (manual)' if getattr(obj, 'latest_manual', False) else ''}"
        skipped = getattr(obj, "latest_skipped", "")
        if skipped:
            return f"{when}: skipped ({skipped})"
        run_id = getattr(obj, "latest_run_id", None)
        if run_id is not None:
            return format_html("{}: {}", when, _run_link(run_id, getattr(obj, "latest_run_status", None)))
        task = getattr(obj, "latest_task_result_id", "")
        return f"{when}: task {task}" if task else f"{when}: its run was pruned"

    @admin.display(description="input")
    def input_json(self, obj: WorkflowSchedule) -> str:
        return pretty_json(obj.input, self.get_empty_value_display())

    @admin.display(description="ledger")
    def ledger(self, obj: WorkflowSchedule) -> str:
        """The newest recorded ticks, with a link to the whole ledger of the schedule."""
        rows = list(
            WorkflowScheduleTick.objects.filter(schedule=obj)
            .select_related("run")
            .order_by("-tick_at")[:LEDGER_ROWS]
        )
        if not rows:
            return self.get_empty_value_display()
        lines = [
            (
                iso(row.tick_at),
                " manual" if row.manual else "",
                f"skipped ({row.skipped})"
                if row.skipped
                else (
                    _run_link(row.run_id, row.run.status if row.run else "")
                    if row.run_id
                    else (f"task {row.task_result_id}" if row.task_result_id else "run pruned")
                ),
            )
            for row in rows
        ]
        url = reverse("admin:pikku_django_workflowscheduletick_changelist") + f"?schedule__id__exact={obj.pk}"
        listed = format_html_join(mark_safe("<br>"), "{}{}: {}", lines)
        return format_html('{}<br><a href="{}">The whole ledger</a>', listed, url)

    @admin.action(description="Pause selected schedules", permissions=["operate"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule]) -> None:
        assert isinstance(queryset, WorkflowScheduleQuerySet)
        selected = queryset.count()
        count = queryset.pause()
        self._report(request, "Paused", count, selected - count, "paused already")

    @admin.action(description="Resume selected schedules", permissions=["operate"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule]) -> None:
        assert isinstance(queryset, WorkflowScheduleQuerySet)
        selected = queryset.count()
        count = queryset.resume()
        self._report(request, "Resumed", count, selected - count, "not paused")

    @admin.action(description="Trigger selected schedules now", permissions=["operate"])
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[WorkflowSchedule]) -> None:
        # One manual tick each, at the database clock's now; a disabled
        # schedule (gone from PIKKU_SCHEDULES) is not triggered.
        # Triggered where writes go, never on the read database the changelist used.
        alias = write_alias(WorkflowSchedule, queryset._db)  # type: ignore[attr-defined]
        selected = queryset.count()
        enabled = list(queryset.using(alias).filter(enabled=True).values_list("name", flat=True))
        for name in enabled:
            schedules.trigger(name, using=alias)
        self._report(request, "Triggered", len(enabled), selected - len(enabled), "disabled")

    def _report(self, request: HttpRequest, verb: str, count: int, skipped: int, why: str) -> None:
        message = f"{verb} {count} schedule{'s' if count != 1 else ''}."
        if skipped:
            message += f" Skipped {skipped} {why}."
        self.message_user(request, message, messages.SUCCESS if count else messages.WARNING)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return has_change_perm(request, WorkflowSchedule)


@admin.register(WorkflowScheduleTick)
class WorkflowScheduleTickAdmin(ReadOnlyAdmin):
    """The ledger: every recorded tick, newest first."""

    list_display = ["schedule", "tick_display", "outcome", "manual", "created_at"]
    list_filter = ["schedule", "skipped", "manual"]
    search_fields = ["schedule__name"]
    list_select_related = ["schedule", "run"]

    @admin.display(description="tick", ordering="tick_at")
    def tick_display(self, obj: WorkflowScheduleTick) -> str:
        return str(iso(obj.tick_at))

    @admin.display(description="outcome")
    def outcome(self, obj: WorkflowScheduleTick) -> str:
        if obj.skipped:
            return f"skipped ({obj.skipped})"
        if obj.run_id is not None:
            return _run_link(obj.run_id, obj.run.status if obj.run else "")
        return f"task {obj.task_result_id}" if obj.task_result_id else "run pruned"
