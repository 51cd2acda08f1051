"""
Operating runs from the admin: retry selected runs, fork a run from one of
its steps, the dead letters one filter away, and inlines capped so a run
with 100,000 signals or steps renders a bounded page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from pikku_django.admin.base import has_change_perm, short_uuid
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import PARKED, write_alias
from pikku_django.managers.held import PENDING_LABEL, SHOWN_STATUSES, shown_as
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.store.operate import RETRYABLE_RUN_STATUSES, retry_run
from pikku_django.workflows.operate import fork_workflow

#: The most rows an inline shows on a run's page; the rest are one link away.
INLINE_ROWS = 50

#: The runs "Retry selected runs" revives per round: each revival is its own
#: transaction, so a long selection never holds one open.
RETRY_BATCH = 100

DEAD_LETTERS = "dead"

#: The status filter's choice of the runs parked for a history that no longer fits their code.
PARKED_RUNS = "parked"


class RunStatusFilter(admin.SimpleListFilter):
    """
    A status filter by the status each run is shown with (a fan-out's items
    not released yet are ``pending``, not ``suspended``), with two more
    choices: the failed and the cancelled runs together, and the parked ones.
    """

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (DEAD_LETTERS, "dead letters (failed or cancelled)"),
            (PARKED_RUNS, "parked (history no longer fits the code)"),
            *[(status, _label(status)) for status in SHOWN_STATUSES],
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == DEAD_LETTERS:
            return queryset.filter(status__in=RETRYABLE_RUN_STATUSES)
        if value == PARKED_RUNS:
            return queryset.filter(PARKED)
        if value in SHOWN_STATUSES:
            return queryset.filter(shown_as(value))
        return queryset


def _label(status: str) -> str:
    return str(RunStatus(status).label) if status in RunStatus.values else PENDING_LABEL


def retry_selected(model_admin: Any, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
    """Revive the failed and cancelled runs selected (task runs too), a bounded batch at a time."""
    # The changelist reads where the router sends reads (a replica, maybe);
    # the revivals, and the read that picks them, go where writes go.
    alias = write_alias(WorkflowRun, queryset._db)  # type: ignore[attr-defined]
    selected = queryset.count()
    retryable = (
        queryset.using(alias)
        .filter(Q(status__in=RETRYABLE_RUN_STATUSES) | PARKED)
        .order_by()
        .values_list("pk", flat=True)
    )
    ids = list(retryable)
    count = 0
    for start in range(0, len(ids), RETRY_BATCH):
        count += sum(retry_run(alias, pk, None) for pk in ids[start : start + RETRY_BATCH])
    model_admin._report(request, "Retried", count, selected - count, "not failed or cancelled")


class CappedFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """An inline formset that shows at most ``INLINE_ROWS`` rows (a read-only page has no more to save)."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_capped"):
            self._capped = super().get_queryset()[:INLINE_ROWS]
        return self._capped


def full_list_link(changelist: str, run: WorkflowRun, total: int, what: str) -> str:
    """ "Showing the first 50 of 1,234 steps: all of them" (the changelist filtered on the run)."""
    return format_html(
        'Showing the first {} of {} {}: <a href="{}?run__id__exact={}">all of them</a>.',
        INLINE_ROWS,
        total,
        what,
        reverse(changelist),
        run.pk,
    )


def fork_button(step: Any) -> str:
    """A button on the run's page that forks the run from this step (posting the page's CSRF token)."""
    url = reverse("admin:pikku_django_workflowrun_fork", args=[step.run_id])
    return format_html(
        '<button type="submit" class="button" formaction="{}" formmethod="post" '
        'name="from_step" value="{}" title="A new run that replays the steps before this one">'
        "Fork from here</button>",
        url,
        step.step_name,
    )


@require_POST
def fork_view(request: HttpRequest, object_id: str) -> HttpResponse:
    """Fork the run from the posted ``from_step`` and go to the new run's page."""
    if not has_change_perm(request, WorkflowRun):
        raise PermissionDenied
    back = reverse("admin:pikku_django_workflowrun_change", args=[object_id])
    try:
        fork = fork_workflow(object_id, request.POST.get("from_step") or None)
    except InvalidArgumentError as error:
        messages.error(request, str(error))
        return HttpResponseRedirect(back)
    messages.success(request, f"Forked run {short_uuid(object_id)} into run {short_uuid(fork.pk)}, due now.")
    return HttpResponseRedirect(reverse("admin:pikku_django_workflowrun_change", args=[fork.pk]))
