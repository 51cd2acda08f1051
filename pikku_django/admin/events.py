"""What the run admin shows of what a run told its readers: its latest events and its streams' tails."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Count, Max
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from pikku_django.models import WorkflowEvent, WorkflowRun, WorkflowStreamItem

#: At most this many events (the latest set first) and streams are shown, each stream's last ``TAIL`` items.
SHOWN_EVENTS = 20
SHOWN_STREAMS = 10
TAIL = 5

#: A value longer than this is cut in the page.
SHOWN_CHARS = 200


def short_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def describe_events(run: WorkflowRun, empty: str) -> str:
    """The run's latest events and the tail of each stream, bounded however many it has."""
    alias = run._state.db or "default"
    events = WorkflowEvent.objects.using(alias).filter(run=run).order_by("-updated_at", "key")
    shown = list(events.values_list("key", "value", "updated_at")[:SHOWN_EVENTS])
    streams = list(
        WorkflowStreamItem.objects.using(alias)
        .filter(run=run)
        .values("stream")
        .annotate(last=Max("offset"), count=Count("pk"))
        .order_by("stream")[:SHOWN_STREAMS]
    )
    if not shown and not streams:
        return empty
    parts: list[SafeString] = []
    if shown:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            ((k, short_json(v), at) for k, v, at in shown),
        )
        parts.append(format_html("<table><tr><th>event</th><th>value</th><th>set</th></tr>{}</table>", rows))
    for stream in streams:
        tail = (
            WorkflowStreamItem.objects.using(alias)
            .filter(run=run, stream=stream["stream"], offset__gt=stream["last"] - TAIL)
            .order_by("offset")
            .values_list("offset", "item")
        )
        items = format_html_join("", "<li>{}: <code>{}</code></li>", ((o, short_json(i)) for o, i in tail))
        parts.append(
            format_html(
                "<p>stream <strong>{}</strong>: {} items, the last {}</p><ul>{}</ul>",
                stream["stream"],
                stream["count"],
                min(TAIL, stream["count"]),
                items,
            )
        )
    return format_html_join("", "{}", ((part,) for part in parts))
