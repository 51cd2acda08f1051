"""
The workers page ("Workers" on the admin index): each worker process as its
heartbeat last wrote it (``worker.beat``). A worker whose name's lock is
held lives (``store.workers.live_holders``, one query for the page's rows);
one whose row stays without its lock stopped without saying so (killed, or
its connection lost) and is flagged.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from pikku_django.admin.base import ReadOnlyAdmin, db_now_ms, format_ms
from pikku_django.admin.refresh import RefreshMixin
from pikku_django.clock import DbNowMs
from pikku_django.models import WorkflowWorker
from pikku_django.store.workers import live_holders


def is_live(obj: WorkflowWorker) -> bool:
    """
    Does ``obj``'s worker hold its name now: as marked for its changelist
    page, or (a row shown alone) asked of the database.
    """
    live = getattr(obj, "live", None)
    if live is None:
        live = obj.holder in live_holders(router.db_for_write(WorkflowWorker), [obj.holder])
        obj.live = live  # type: ignore[attr-defined]
    return bool(live)


@admin.register(WorkflowWorker)
class WorkflowWorkerAdmin(RefreshMixin, ReadOnlyAdmin):
    list_display = [
        "holder",
        "state",
        "host",
        "pid",
        "lanes",
        "queues_display",
        "runs_in_hand",
        "last_seen",
        "code_version",
    ]
    search_fields = ["holder", "host"]
    fields = [*(str(name) for name in list_display), "up_for"]
    readonly_fields = ["state", "queues_display", "last_seen", "up_for"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowWorker]:
        # The database clock's now rides on each row: ages need no query of their own.
        rows: QuerySet[WorkflowWorker] = super().get_queryset(request)
        return rows.annotate(db_now_ms=DbNowMs())

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # The page's rows, read here once (the list iterates the same
        # objects), marked live or not by one look at their names' locks.
        changelist: ChangeList = super().get_changelist_instance(request)
        rows: Any = changelist.result_list
        live = live_holders(router.db_for_write(WorkflowWorker), [row.holder for row in rows])
        for row in rows:
            row.live = row.holder in live
        return changelist

    @admin.display(description="state")
    def state(self, obj: WorkflowWorker) -> str:
        if is_live(obj):
            return format_html('<span style="color: #2e7d32">{}</span>', "live")
        return format_html(
            '<strong style="color: #ba2121" title="{}">{}</strong>',
            "Its process holds its name no more (killed, or its connection lost) but left its row.",
            "gone quiet: stopped without saying so",
        )

    @admin.display(description="queues")
    def queues_display(self, obj: WorkflowWorker) -> str:
        return obj.queues or "every queue"

    @admin.display(description="last seen", ordering="seen_at")
    def last_seen(self, obj: WorkflowWorker) -> str:
        if is_live(obj):
            return "now" if obj.runs_in_hand else "now (idle)"
        return f"row last written {format_ms(max(0, db_now_ms(obj) - obj.seen_at))} ago"

    @admin.display(description="up for")
    def up_for(self, obj: WorkflowWorker) -> str:
        if is_live(obj):
            return format_ms(max(0, db_now_ms(obj) - obj.started_at))
        return "-"
