"""``stream_sse``: a run's stream as Server-Sent Events, under WSGI and ASGI, resumed from Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.http import Http404
from django.test import AsyncRequestFactory, RequestFactory, TransactionTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.views import resume_offset, stream_sse
from pikku_django.workflows import run_workflow, send_signal, start_workflow

ROOT = Path(__file__).resolve().parents[2]


def events(body: bytes) -> list[dict[str, str]]:
    """The events of an SSE body, each as its fields."""
    parsed = []
    for block in body.decode().split("\n\n"):
        if block.strip():
            parsed.append(dict(line.split(": ", 1) for line in block.splitlines()))
    return parsed


class StreamSseTests(TransactionTestCase):
    def test_items_with_their_offsets_then_the_end(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        response = stream_sse(RequestFactory().get("/"), run.pk, "log")
        assert response["Content-Type"] == "text/event-stream"
        assert response["Cache-Control"] == "no-cache"
        got = events(b"".join(response.streaming_content))  # type: ignore[arg-type]
        assert [(e["id"], json.loads(e["data"])) for e in got[:-1]] == [(str(i), {"i": i}) for i in range(5)]
        assert got[-1] == {"event": "end", "data": '{"status": "completed"}'}

    def test_a_browser_resumes_after_its_last_event_id(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        request = RequestFactory().get("/", headers={"Last-Event-ID": "2"})
        got = events(b"".join(stream_sse(request, run.pk, "log").streaming_content))  # type: ignore[arg-type]
        assert [e.get("id") for e in got] == ["3", "4", None]

    def test_a_running_run_s_stream_ends_at_the_timeout_without_an_end_event(self) -> None:
        run = run_workflow(start_workflow("test.emits", {}).pk)
        response = stream_sse(RequestFactory().get("/"), run.pk, "log", timeout_ms=100)
        got = events(b"".join(response.streaming_content))  # type: ignore[arg-type]
        assert [e["id"] for e in got] == ["0", "1", "2"]
        send_signal(run.pk, "go")
        run_workflow(run.pk)

    def test_under_asgi_the_stream_is_an_async_iterator(self) -> None:
        run = start_workflow("test.emits", {"wait": False}, inline=True)
        request = AsyncRequestFactory().get("/", headers={"Last-Event-ID": "3"})
        response = stream_sse(request, run.pk, "log")
        assert response.is_async

        async def read() -> bytes:
            try:
                return b"".join([chunk async for chunk in response.streaming_content])  # type: ignore[union-attr]
            finally:
                await sync_to_async(connections.close_all)()

        got = events(asyncio.run(read()))
        assert [e.get("id") for e in got] == ["4", None]

    def test_an_unknown_run_is_a_404_and_a_bad_stream_a_value_error(self) -> None:
        with pytest.raises(Http404):
            stream_sse(RequestFactory().get("/"), "00000000-0000-0000-0000-000000000000", "log")
        with pytest.raises(Http404):
            stream_sse(RequestFactory().get("/"), "nonsense", "log")
        with pytest.raises(InvalidArgumentError, match="stream"):
            stream_sse(RequestFactory().get("/"), "00000000-0000-0000-0000-000000000000", "")


@pytest.mark.parametrize(
    ("header", "offset"), [(None, 0), ("7", 8), ("x", 0), ("-1", 0), (" 3 ", 4), ("9" * 30, 0), ("\u0663", 0)]
)
def test_resume_offset(header: Any, offset: int) -> None:
    headers = {} if header is None else {"Last-Event-ID": header}
    assert resume_offset(RequestFactory().get("/", headers=headers)) == offset


class TheDocumentedExampleTests(TransactionTestCase):
    """The page of docs/results-events-streams.md, as the test project serves it."""

    def test_the_page_points_its_event_source_at_the_stream(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 2}, inline=True)
        page = self.client.get(f"/imports/{run.pk}/")
        assert page.status_code == 200
        assert f'new EventSource("/imports/{run.pk}/log")' in page.content.decode()

    def test_the_stream_resumes_after_the_browser_s_last_event_id(self) -> None:
        run = start_workflow("test.chunks", {"chunks": 2}, inline=True)
        response = self.client.get(f"/imports/{run.pk}/log", headers={"Last-Event-ID": "3"})
        assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
        got = events(b"".join(response.streaming_content))  # type: ignore[attr-defined]
        assert [(e.get("id"), json.loads(e["data"])) for e in got] == [
            ("4", "line 1"),
            ("5", {"chunk": 1}),
            (None, {"status": "completed"}),
        ]

    def test_the_docs_show_the_view_and_the_template_the_project_serves(self) -> None:
        docs = (ROOT / "docs" / "results-events-streams.md").read_text()
        template = (ROOT / "testproject" / "demo" / "templates" / "import.html").read_text()
        assert f"<!-- import.html -->\n{template}```" in docs
        views = (ROOT / "testproject" / "demo" / "views.py").read_text()
        lines = ('    return stream_sse(request, run_id, "log")', '    return render(request, "import.html"')
        for line in lines:
            assert line in docs and line in views
