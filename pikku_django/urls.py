"""
The app's own pages, to include under a prefix of the project's:
``path("pikku/", include("pikku_django.urls"))``. ``metrics/`` is served
with the ``metrics`` extra (``prometheus-client``) installed.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

metrics_view: Callable[[HttpRequest], HttpResponse] | None
try:
    from pikku_django.metrics import metrics_view
except ImportError:  # the ``metrics`` extra is not installed: nothing of it is imported
    metrics_view = None

app_name = "pikku_django"

urlpatterns: list[URLPattern] = []
if metrics_view is not None:
    urlpatterns.append(path("metrics/", metrics_view, name="metrics"))
