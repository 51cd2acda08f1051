"""What the run admin says about a run that waits: asleep, on a signal, on a child."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from pikku_django.admin.base import ReadOnlyAdmin, ReadOnlyTabularInline, format_ms, pretty_json, short_uuid
from pikku_django.admin.operate import CappedFormSet
from pikku_django.managers.signals import SIGNAL_RPC
from pikku_django.models import WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.workflows.waits import CHILD_RPC, SLEEP_RPC


def waiting_annotations() -> dict[str, Subquery]:
    """
    The outer run's waiting step (a sleep, a signal wait, a step parked on a
    child), as correlated subqueries on the unique (run, step_name) index: the
    list page costs the same queries however many runs it shows.
    """
    waiting = (
        WorkflowStep.objects.filter(run=OuterRef("pk"))
        .filter(
            Q(rpc_name=SLEEP_RPC, status__in=["pending", "scheduled"])
            | Q(rpc_name=SIGNAL_RPC, status__in=["pending", "suspended"])
            | Q(rpc_name=CHILD_RPC, status="running", child_run__isnull=False)
        )
        .order_by("-created_at")
    )
    return {
        "waiting_kind": Subquery(waiting.values("rpc_name")[:1]),
        "waiting_child": Subquery(waiting.values("child_run_id")[:1]),
        "waiting_signal": Subquery(waiting.annotate(v=KT("data__signal")).values("v")[:1]),
        "waiting_at": Subquery(waiting.annotate(v=KT("data__wake_at")).values("v")[:1]),
        "waiting_since": Subquery(waiting.annotate(v=KT("data__since")).values("v")[:1]),
    }


def _when(ms: Any) -> str:
    return datetime.datetime.fromtimestamp(int(ms) / 1000, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def describe_wait(run: WorkflowRun, now_ms: int) -> str | None:
    """Why the run waits, in words (with a link to a child), or None if it does not."""
    if run.is_finished:
        return None
    if not hasattr(run, "waiting_kind"):
        annotated = (
            WorkflowRun.objects.using(run._state.db).filter(pk=run.pk).annotate(**waiting_annotations())
        )
        for name, value in annotated.values(*waiting_annotations()).get().items():
            setattr(run, name, value)
    kind = getattr(run, "waiting_kind", None)
    if kind == SLEEP_RPC and run.waiting_at is not None:  # type: ignore[attr-defined]
        wake_at = int(run.waiting_at)  # type: ignore[attr-defined]
        left = wake_at - now_ms
        return f"sleeping until {_when(wake_at)}" + (f" (in {format_ms(left)})" if left > 0 else "")
    if kind == SIGNAL_RPC:
        since = run.waiting_since  # type: ignore[attr-defined]
        text = f'waiting for signal "{run.waiting_signal}"'  # type: ignore[attr-defined]
        return text + (f" since {_when(since)}" if since is not None else "")
    if kind == CHILD_RPC and run.waiting_child is not None:  # type: ignore[attr-defined]
        # A subquery's value comes back raw: a 32-digit string on SQLite and MariaDB.
        child = uuid.UUID(str(run.waiting_child))  # type: ignore[attr-defined]
        url = reverse("admin:pikku_django_workflowrun_change", args=[child])
        return format_html('waiting for child <a href="{}">{}</a>', url, short_uuid(child))
    return None


class SignalColumns(admin.options.BaseModelAdmin):  # type: ignore[type-arg]
    """Columns a signal shows on its run's page and in the signal list."""

    @admin.display(description="payload")
    def payload_json(self, obj: WorkflowSignal) -> str:
        return pretty_json(obj.payload, self.get_empty_value_display())

    @admin.display(description="sent", ordering="sent_at")
    def sent(self, obj: WorkflowSignal) -> str:
        return _when(obj.sent_at)


class WorkflowSignalInline(SignalColumns, ReadOnlyTabularInline):
    """The signals sent to a run (the first ``INLINE_ROWS``), and which wait consumed each."""

    model = WorkflowSignal
    formset = CappedFormSet
    fields = ["name", "payload_json", "sent", "consumed_by"]
    readonly_fields = ["payload_json", "sent"]
    ordering = ["sent_at", "id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowSignal]:
        signals: QuerySet[WorkflowSignal] = super().get_queryset(request)
        return signals.select_related("consumed_by")


@admin.register(WorkflowSignal)
class WorkflowSignalAdmin(SignalColumns, ReadOnlyAdmin):
    """Every signal, filtered on its run from the run's page (``?run__id__exact=``)."""

    list_display = ["name", "run_link", "payload_json", "sent", "consumed_by"]
    list_select_related = ["consumed_by"]
    search_fields = ["name", "run__id"]
    ordering = ["-sent_at", "-id"]

    @admin.display(description="run")
    def run_link(self, obj: WorkflowSignal) -> str:
        url = reverse("admin:pikku_django_workflowrun_change", args=[obj.run_id])
        return format_html('<a href="{}">{}</a>', url, short_uuid(obj.run_id))
