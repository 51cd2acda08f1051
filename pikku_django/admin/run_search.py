"""
How the run list is filtered and searched on a large table: the workflow
filter's choices come from the registry (no ``SELECT DISTINCT`` over every
run), and a search term is an exact workflow name, an exact idempotency
key, or a run id or the start of one (a range of the primary key, never a
``LIKE`` over the UUID's text).
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
        match = Q(workflow=term) | Q(idempotency_key=term)
        ids = id_range(term)
        if ids is not None:
            match |= Q(pk__gte=ids[0], pk__lte=ids[1])
        queryset = queryset.filter(match)
    return queryset
