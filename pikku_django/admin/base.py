"""What every admin here shares: read-only rows, durations, JSON, the DB clock."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.db import models
from django.http import HttpRequest
from django.utils.html import format_html

from pikku_django.models import Lease


def format_ms(ms: int) -> str:
    """A short human duration: ``950 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 3 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class ReadOnlyMixin:
    """Rows written by workers: viewable, never added, edited or deleted by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = self.model._meta.fields  # type: ignore[attr-defined]
        return [field.name for field in fields] + list(self.readonly_fields)  # type: ignore[attr-defined]


class ReadOnlyAdmin(ReadOnlyMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A ModelAdmin for rows written by workers."""


def short_uuid(pk: Any) -> str:
    """The first eight hex digits of a UUID: enough to tell runs apart on a page."""
    return str(pk)[:8]


def pretty_json(value: Any, empty: str) -> str:
    """A JSON value indented in a ``<pre>``, or ``empty`` for NULL."""
    if value is None:
        return empty
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def db_now_ms(obj: models.Model) -> int:
    """
    The database clock's now for ``obj``: the ``db_now_ms`` its queryset was
    annotated with, or (for an object fetched elsewhere) read from its database.
    """
    now = getattr(obj, "db_now_ms", None)
    if now is None:
        now = Lease.objects.db_manager(obj._state.db).db_now_ms()
    return int(now)


def has_change_perm(request: HttpRequest, model: type[models.Model]) -> bool:
    """Does the user hold the model's change permission (the admins here grant no editing)?"""
    opts = model._meta
    return bool(request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"))


class ReadOnlyTabularInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    """The inline twin of ``ReadOnlyAdmin``."""

    extra = 0
    can_delete = False
