"""
The workers page ("Workers" on the admin index): each worker process as its
last heartbeat left it (``worker.beat``), when it was last seen on the
database clock, and those gone quiet (killed, or hung) flagged.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from pikku_django.admin.base import ReadOnlyAdmin, db_now_ms, format_ms
from pikku_django.admin.refresh import RefreshMixin
from pikku_django.clock import DbNowMs
from pikku_django.models import QUIET_AFTER_MS, WorkflowWorker


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

    @admin.display(description="state", ordering="-seen_at")
    def state(self, obj: WorkflowWorker) -> str:
        quiet = db_now_ms(obj) - obj.seen_at
        if quiet > QUIET_AFTER_MS:
            return format_html('<strong style="color: #ba2121">quiet for {}</strong>', format_ms(quiet))
        return format_html('<span style="color: #2e7d32">{}</span>', "live")

    @admin.display(description="queues")
    def queues_display(self, obj: WorkflowWorker) -> str:
        return obj.queues or "every queue"

    @admin.display(description="last seen", ordering="seen_at")
    def last_seen(self, obj: WorkflowWorker) -> str:
        return f"{format_ms(max(0, db_now_ms(obj) - obj.seen_at))} ago"

    @admin.display(description="up for")
    def up_for(self, obj: WorkflowWorker) -> str:
        return format_ms(max(0, db_now_ms(obj) - obj.started_at))
