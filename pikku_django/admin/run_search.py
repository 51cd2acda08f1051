"""
How the run list is filtered and searched on a large table: the workflow
filter's choices come from the registry (no ``SELECT DISTINCT`` over every
run), and a search term is an exact workflow name, an exact idempotency
key, or a run id or the start of one (a range of the primary key, never a
``LIKE`` over the UUID's text).

The key and the id are each looked up on their own, and the list is then
filtered on the ids found: one WHERE that ORs the id with the key and the
name is planned by SQLite, once it has statistics of a table whose runs
mostly have no key, as a scan of every run (issue 30).
"""

from __future__ import annotations

import string
import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from pikku_django.models import WorkflowRun
from pikku_django.workflows.registry import registered

#: The shortest id prefix searched as one (the run list shows 8 characters).
MIN_ID_PREFIX = 4

#: The most runs one id prefix finds (the shortest prefix, on the largest table,
#: finds a few thousand; the list pages them).
MAX_ID_MATCHES = 1000


class WorkflowFilter(admin.SimpleListFilter):
    """Runs of one workflow; the choices are the workflows this process has registered."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registered())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(workflow=value) if value else queryset


def id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids starting with ``term`` (hex digits, dashes ignored) as a range; None for no such prefix."""
    digits = term.replace("-", "").lower()
    if not MIN_ID_PREFIX <= len(digits) <= 32 or any(c not in string.hexdigits for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def search_runs(queryset: QuerySet[WorkflowRun], search_term: str) -> QuerySet[WorkflowRun]:
    """Runs matching every word of ``search_term``: each an index probe or a range, never a scan."""
    for term in search_term.split():
        queryset = queryset.filter(_term_match(queryset.db, term))
    return queryset


def _term_match(alias: str, term: str) -> Q:
    """
    The runs ``term`` names: the run whose idempotency key it is, and the
    runs whose id starts with it, each found by a probe of its own unique
    index; and the runs of the workflow so named, unless the term looks
    like an id and names no registered workflow.
    """
    runs = WorkflowRun.objects.using(alias).order_by()
    ids = list(runs.filter(idempotency_key=term).values_list("pk", flat=True)[:1])
    bounds = id_range(term)
    if bounds is not None:
        in_range = runs.filter(pk__gte=bounds[0], pk__lte=bounds[1]).order_by("pk")
        ids += [pk for pk in in_range.values_list("pk", flat=True)[:MAX_ID_MATCHES] if pk not in ids]
    match = Q(pk__in=ids)
    if bounds is None or term in registered():
        match |= Q(workflow=term)
    return match
