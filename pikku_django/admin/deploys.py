"""
The runs list's filters for safe deploys (docs/safe-deploys.md): by the
code version a run was started under, and by the patch markers it holds,
so a patch's old branch is deleted only once no unfinished run needs it.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest

from pikku_django.managers.versions import code_version
from pikku_django.models import WorkflowPatch, WorkflowRun
from pikku_django.workflows.registry import registered

#: A patch named in a workflow's source: ``ctx.patched("x")`` or ``ctx.deprecate_patch("x")``.
PATCH_CALL = re.compile(r"""\b(?:patched|deprecate_patch)\(\s*["']([^"'\\]+)["']""")

#: The code version filter's choices: runs started under this code's version, or another.
THIS_CODE, OTHER_CODE = "this", "other"


def current_versions() -> dict[str, str]:
    """The version this process stamps on a run of each workflow it knows."""
    return {name: code_version(name) for name in registered()}


@functools.lru_cache(maxsize=64)
def _module_patches(module: str) -> frozenset[str]:
    try:
        source = inspect.getsource(sys.modules[module])
    except (KeyError, OSError, TypeError):
        return frozenset()
    return frozenset(PATCH_CALL.findall(source))


def code_patch_names() -> list[str]:
    """The patch names the modules of the registered workflows mention (read from their source)."""
    modules = {fn.__module__ for fn in registered().values()}
    return sorted(set().union(*(_module_patches(module) for module in modules)))


class CodeVersionFilter(admin.SimpleListFilter):
    """
    Runs by the code version they were started under: this code's (per
    workflow, as this process would stamp a new run), another, or any one
    version by URL (``?code_version=v1``). The choices read no table.
    """

    title = "code version"
    parameter_name = "code_version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(THIS_CODE, "this code's version"), (OTHER_CODE, "another version")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value not in (THIS_CODE, OTHER_CODE):
            return queryset.filter(code_version=value)
        this = Q(pk__in=[])
        for name, version in current_versions().items():
            this |= Q(workflow=name, code_version=version)
        return queryset.filter(this) if value == THIS_CODE else queryset.exclude(this)


class PatchFilter(admin.SimpleListFilter):
    """
    Runs that hold the patch marker X (``ctx.patched("X")`` took its new
    path): a choice per patch the workflows' code names, any other by URL
    (``?patch=X``). The choices read no table.
    """

    title = "holds patch"
    parameter_name = "patch"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in code_patch_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(Exists(WorkflowPatch.objects.filter(run=OuterRef("pk"), name=value)))


def patch_names(run: WorkflowRun) -> str:
    """The patch markers ``run`` holds, comma-separated ("" for none)."""
    if not run.has_patches:
        return ""
    return ", ".join(WorkflowPatch.objects.filter(run=run).order_by("name").values_list("name", flat=True))
