"""
What the run list and a run's page lead with: the run's name (a task's own
name, not the task workflow's), its status in colour, its error's last line
and its traceback as text, a summary, the buttons to retry, cancel and fork
it (POSTs with the page's CSRF token, checked for the change permission),
and the list's default of top-level runs (a fan-out's items behind their
parent, one filter away).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from pikku_django.admin.base import has_change_perm, short_uuid
from pikku_django.managers.held import PENDING, PENDING_LABEL
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.store.operate import RETRYABLE_RUN_STATUSES
from pikku_django.workflows.control import cancel_workflow
from pikku_django.workflows.operate import retry_workflow

#: The request a run's page is rendered for (``WorkflowRunAdmin.change_view``), for its buttons.
PAGE_REQUEST: ContextVar[HttpRequest | None] = ContextVar("pikku_run_page_request", default=None)

#: The colour of each run status, on the list and the run's page.
STATUS_COLOURS: dict[str, str] = {
    PENDING: "#5c6bc0",
    RunStatus.RUNNING: "#1565c0",
    RunStatus.SUSPENDED: "#6d4c41",
    RunStatus.COMPLETED: "#2e7d32",
    RunStatus.FAILED: "#c62828",
    RunStatus.CANCELLED: "#757575",
}


#: The run page's fields left out when the run's own row leaves their column
#: empty (no query asked): each field and its column.
WHEN_SET = {
    "wake_display": "wake_at",
    "deadline_display": "deadline_at",
    "parent_display": "parent_id",
    "idempotency_key": "idempotency_key",
    "key": "key",
    "dedup_key": "dedup_key",
    "forked_from": "forked_from_id",
    "output_json": "output",
    "error_json": "error",
}


def shown_fields(fields: list[str], run: WorkflowRun | None) -> list[str]:
    """
    A run page's fields, less those its row shows are empty (``WHEN_SET``),
    so that the page leads with what the run has; the add form shows all.
    """
    if run is None:
        return list(fields)
    empty = {name for name, column in WHEN_SET.items() if getattr(run, column) is None}
    if not run.has_patches:
        empty.add("patches_display")
    return [name for name in fields if name not in empty]


def coloured_status(status: str) -> str:
    """A status as shown (``managers.held.shown_status``), in its colour; ``pending`` in words."""
    colour = STATUS_COLOURS.get(status, "inherit")
    shown = PENDING_LABEL if status == PENDING else status
    return format_html('<strong style="color: {}">{}</strong>', colour, shown)


def error_last_line(error: Any) -> str:
    """The last line of a stored error's traceback (``Type: message``), or its message; "" for none."""
    if not isinstance(error, dict):
        return "" if error is None else str(error)
    lines = [line for line in str(error.get("traceback") or "").splitlines() if line.strip()]
    if lines:
        return lines[-1]
    message = str(error.get("message") or "")
    kind = str(error.get("type") or "")
    return f"{kind}: {message}" if kind else message


def readable_error(error: Any, empty: str) -> str:
    """A stored error as its type and message, then its traceback as text (not escaped JSON)."""
    if error is None:
        return empty
    if not isinstance(error, dict):
        return format_html("<pre>{}</pre>", str(error))
    traceback = str(error.get("traceback") or "")
    head = f"{error.get('type', '')}: {error.get('message', '')}"
    return format_html(
        '<strong>{}</strong><pre style="white-space: pre-wrap; max-height: 40em; overflow: auto">{}</pre>',
        head,
        traceback or "(no traceback)",
    )


def run_buttons(run: WorkflowRun) -> str:
    """Retry, cancel and fork buttons for the run's page, each as it applies; none without the permission."""
    request = PAGE_REQUEST.get()
    if request is None or not has_change_perm(request, WorkflowRun):
        return ""
    buttons: list[tuple[str, str, str]] = []
    if run.status in RETRYABLE_RUN_STATUSES:
        buttons.append((reverse("admin:pikku_django_workflowrun_retry", args=[run.pk]), "retry", "Retry"))
    if not run.is_finished:
        buttons.append((reverse("admin:pikku_django_workflowrun_cancel", args=[run.pk]), "cancel", "Cancel"))
    buttons.append(
        (reverse("admin:pikku_django_workflowrun_fork", args=[run.pk]), "fork", "Fork from the start")
    )
    return format_html_join(
        mark_safe(" "),
        '<button type="submit" class="button" formaction="{}" formmethod="post" '
        'name="do" value="{}">{}</button>',
        buttons,
    )


def _operate(request: HttpRequest, object_id: str, verb: str, done: bool) -> HttpResponse:
    if done:
        messages.success(request, f"{verb} run {short_uuid(object_id)}.")
    else:
        messages.warning(request, f"Run {short_uuid(object_id)} was not {verb.lower()}: nothing changed.")
    return HttpResponseRedirect(reverse("admin:pikku_django_workflowrun_change", args=[object_id]))


@require_POST
def retry_view(request: HttpRequest, object_id: str) -> HttpResponse:
    """Retry the failed or cancelled run from where it stopped, and go back to its page."""
    if not has_change_perm(request, WorkflowRun):
        raise PermissionDenied
    return _operate(request, object_id, "Retried", retry_workflow(object_id))


@require_POST
def cancel_view(request: HttpRequest, object_id: str) -> HttpResponse:
    """Cancel the unfinished run (and its children), and go back to its page."""
    if not has_change_perm(request, WorkflowRun):
        raise PermissionDenied
    return _operate(request, object_id, "Cancelled", cancel_workflow(object_id))


class LevelFilter(admin.SimpleListFilter):
    """Top-level runs and their ``ctx.workflow`` children by default; a fan-out's items only when asked."""

    title = "fan-out items"
    parameter_name = "items"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("all", "shown too"), ("only", "only")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        value = self.value()
        if value == "all" or request.GET.get("parent_step") or request.GET.get("status") == PENDING:
            # The items of one fan-out (its run page's link), or the items not
            # released yet (only items are), are what was asked for.
            return queryset
        if value == "only":
            return queryset.filter(parent_step__isnull=False)
        return queryset.filter(parent_step__isnull=True)
