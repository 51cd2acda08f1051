"""The lease admin: live or lapsed on the database clock, and an expire action."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from pikku_django.admin.base import ReadOnlyAdmin, format_ms
from pikku_django.clock import DbNowMs
from pikku_django.managers import LeaseQuerySet
from pikku_django.models import Lease


class LeaseStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "Live"), ("lapsed", "Lapsed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "live":
            return queryset.filter(expires_at__gt=DbNowMs())
        if self.value() == "lapsed":
            return queryset.filter(expires_at__lte=DbNowMs())
        return None


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["key", "holder", "token", "expires_display", "state", "time_left"]
    list_filter = [LeaseStateFilter]
    search_fields = ["key", "holder"]
    ordering = ["key"]
    readonly_fields = ["expires_display", "state", "time_left"]
    actions = ["expire_leases"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        # Each row carries the database clock's now, so "live" and "time left"
        # are judged on the clock leases are judged on, not the web server's.
        leases: QuerySet[Lease] = super().get_queryset(request)
        return leases.annotate(db_now_ms=DbNowMs())

    def _left_ms(self, obj: Lease) -> int:
        now = getattr(obj, "db_now_ms", None)
        if now is None:
            now = Lease.objects.db_manager(obj._state.db).db_now_ms()
        return int(obj.expires_at) - int(now)

    @admin.display(description="expires", ordering="expires_at")
    def expires_display(self, obj: Lease) -> datetime.datetime:
        return obj.expires

    @admin.display(description="state", ordering="expires_at")
    def state(self, obj: Lease) -> str:
        return "live" if self._left_ms(obj) > 0 else "lapsed"

    @admin.display(description="time left", ordering="expires_at")
    def time_left(self, obj: Lease) -> str:
        left = self._left_ms(obj)
        return format_ms(left) if left > 0 else self.get_empty_value_display()

    @admin.action(description="Expire selected leases", permissions=["expire"])
    def expire_leases(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        # The tokens stay: a later holder still gets a higher one, and the old
        # holder's next renewal is refused.
        assert isinstance(queryset, LeaseQuerySet)
        count = queryset.expire()
        self.message_user(
            request,
            f"Expired {count} lease{'s' if count != 1 else ''}.",
            messages.SUCCESS if count else messages.WARNING,
        )

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("pikku_django.change_lease"))
