"""
``stream_sse``: a run's stream as Server-Sent Events, for a browser's
``EventSource``. Each item is an event whose ``id:`` is its offset and whose
``data:`` is the item as JSON; a reconnecting browser sends ``Last-Event-ID``
and resumes after it. Once the run has finished and its last item is sent, a
last ``end`` event carries the run's status and the response ends (an
``EventSource`` that hears it should ``close()``; one that reconnects gets
the ``end`` event again at once). A wait for the next item that reaches its
timeout ends the response too, and the browser reconnects where it was.

Under WSGI each open stream keeps a worker thread, but no database
connection while it waits (it is closed between looks); under ASGI (uvicorn,
daphne) a stream is a coroutine between looks: use ASGI for many open streams.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, StreamingHttpResponse

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError
from pikku_django.workflows.results import (
    DEFAULT_STREAM_TIMEOUT_MS,
    StreamReader,
    aread_items,
    read_items,
    run_state,
    stream_reader,
)


def resume_offset(request: HttpRequest) -> int:
    """The offset after the browser's ``Last-Event-ID`` (0 without one, or with one that is no offset)."""
    last = request.headers.get("Last-Event-ID", "").strip()
    if last.isascii() and last.isdigit() and int(last) < validate.MAX_BIGINT:
        return int(last) + 1
    return 0


def sse_event(offset: int, item: Any) -> bytes:
    """One item as an event: its offset as ``id``, its JSON as ``data`` (one line)."""
    return f"id: {offset}\ndata: {json.dumps(item, separators=(',', ':'))}\n\n".encode()


def sse_end(status: str) -> bytes:
    """The last event of a stream whose run has finished."""
    return f"event: end\ndata: {json.dumps({'status': status})}\n\n".encode()


def stream_sse(
    request: HttpRequest,
    run_id: Any,
    stream: str,
    *,
    timeout_ms: int = DEFAULT_STREAM_TIMEOUT_MS,
    using: str | None = None,
) -> StreamingHttpResponse:
    """
    The run's ``stream`` as ``text/event-stream``, from after the request's
    ``Last-Event-ID`` on; an unknown run is a 404. Call it from a sync view.
    """
    validate.name("stream", stream)
    reader = stream_reader(run_id, stream, resume_offset(request), timeout_ms, using)
    try:
        run_state(reader.alias, run_id)
    except InvalidArgumentError as error:
        raise Http404(str(error)) from error
    content: Iterator[bytes] | AsyncIterator[bytes]
    if isinstance(request, ASGIRequest):
        content = _aevents(reader, timeout_ms)
    else:
        content = _events(reader, timeout_ms)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    # Proxies (nginx) pass each event on at once.
    response["X-Accel-Buffering"] = "no"
    return response


def _events(reader: StreamReader, timeout_ms: int) -> Iterator[bytes]:
    for offset, item in read_items(reader, timeout_ms, release=True):
        yield sse_event(offset, item)
    status, _ = run_state(reader.alias, reader.run_id, missing_ok=True)
    if reader.ended(status):
        yield sse_end(status or "pruned")


async def _aevents(reader: StreamReader, timeout_ms: int) -> AsyncIterator[bytes]:
    async for offset, item in aread_items(reader, timeout_ms, checked=True):
        yield sse_event(offset, item)
    status, _ = await sync_to_async(run_state)(reader.alias, reader.run_id, missing_ok=True)
    if reader.ended(status):
        yield sse_end(status or "pruned")


__all__ = ["resume_offset", "sse_end", "sse_event", "stream_sse"]
