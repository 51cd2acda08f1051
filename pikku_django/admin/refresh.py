"""``?refresh=N`` on a changelist: the page reloads itself every N seconds."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

#: The shortest reload a page may ask for, in seconds.
MIN_REFRESH_S = 2


class RefreshMixin:
    """
    A changelist that takes ``?refresh=N`` (seconds, at least
    ``MIN_REFRESH_S``): the parameter is kept out of the admin's filters and
    the answer carries a ``Refresh`` header, which browsers follow.
    """

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        seconds = None
        if "refresh" in request.GET:
            query = request.GET.copy()
            raw = query.pop("refresh")[-1]
            seconds = max(MIN_REFRESH_S, int(raw)) if raw.isdigit() else None
            request.GET = query  # type: ignore[assignment]
        response: HttpResponse = super().changelist_view(request, extra_context)  # type: ignore[misc]
        if seconds is not None:
            url = request.get_full_path()
            separator = "&" if "?" in url else "?"
            response["Refresh"] = f"{seconds}; url={url}{separator}refresh={seconds}"
        return response
