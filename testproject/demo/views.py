"""The example of docs/results-events-streams.md: a page that shows a run's ``log`` stream as it grows."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render

from pikku_django.views import stream_sse


def import_log(request: HttpRequest, run_id: Any) -> StreamingHttpResponse:
    return stream_sse(request, run_id, "log")  # text/event-stream; resumes after Last-Event-ID


def import_page(request: HttpRequest, run_id: Any) -> HttpResponse:
    return render(request, "import.html", {"run_id": run_id})
