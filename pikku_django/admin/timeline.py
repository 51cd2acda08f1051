"""
A run's timeline, drawn server-side as inline SVG: one bar per attempt, on
the database clock, in segments (queued, running, lost worker, retry delay,
sleep, waiting), each with its times and worker in a ``<title>`` shown on
hover. No JavaScript, nothing fetched from elsewhere.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from pikku_django.admin.base import format_ms
from pikku_django.clock import DbNow
from pikku_django.managers.signals import SIGNAL_RPC
from pikku_django.models import WorkflowRun, WorkflowStepAttempt
from pikku_django.store.operate import CHILD_RPC, SLEEP_RPC

#: At most this many bars (attempts) are drawn, so a page stays bounded.
MAX_BARS = 200

#: Each kind of segment: its label in the legend and its colour.
KINDS: dict[str, tuple[str, str]] = {
    "queued": ("queued", "#c9d3dd"),
    "running": ("running", "#3d7fc1"),
    "succeeded": ("running (succeeded)", "#3c9d5d"),
    "failed": ("running (failed)", "#c8483b"),
    "timeout": ("running (timed out)", "#7a1f17"),
    "lost": ("lost worker", "#8a5a9e"),
    "delay": ("retry delay", "#e0a33a"),
    "sleep": ("sleep", "#9bb7d4"),
    "waiting": ("waiting (signal or children)", "#f0d36b"),
}

#: The errors of an attempt failed by its ``timeout_ms``, by the end of their stored type.
TIMEOUT_TYPES = (".StepTimeoutError", ".TaskTimeoutError")

LABEL_WIDTH = 190
PLOT_WIDTH = 640
ROW_HEIGHT = 18
BAR_HEIGHT = 12


@dataclass
class Segment:
    kind: str
    start: datetime.datetime
    end: datetime.datetime


@dataclass
class Bar:
    label: str
    holder: str
    segments: list[Segment]


def _stamp(value: datetime.datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _ms(start: datetime.datetime, end: datetime.datetime) -> int:
    return max(0, int((end - start).total_seconds() * 1000))


def bars(attempts: list[dict[str, Any]], now: datetime.datetime) -> list[Bar]:
    """The bars of a run's attempts (``values()`` rows in step, then attempt order)."""
    drawn: list[Bar] = []
    for i, row in enumerate(attempts):
        later = attempts[i + 1] if i + 1 < len(attempts) else None
        if later is not None and later["step_id"] != row["step_id"]:
            later = None
        drawn.append(
            Bar(f"{row['step__step_name']} #{row['attempt']}", row["holder"], _segments(row, later, now))
        )
    return drawn


def _segments(row: dict[str, Any], later: dict[str, Any] | None, now: datetime.datetime) -> list[Segment]:
    created, running = row["created_at"], row["running_at"]
    ended = row["succeeded_at"] or row["failed_at"]
    rpc, status = row["step__rpc_name"], row["status"]
    if rpc in (SLEEP_RPC, SIGNAL_RPC):
        # A sleep or a signal wait holds no worker: the whole attempt is waiting.
        return [Segment("sleep" if rpc == SLEEP_RPC else "waiting", created, ended or now)]
    segments: list[Segment] = []
    start = running or ended or now
    if created < start:
        segments.append(Segment("queued", created, start))
    if running is None:
        return segments
    if rpc == CHILD_RPC:
        segments.append(Segment("waiting", running, ended or now))
    elif ended is not None:
        segments.append(Segment(_ended_kind(row), running, ended))
    elif later is not None:
        # Still "running" with a later attempt: its worker was lost until the next one took it.
        segments.append(Segment("lost", running, later["running_at"] or later["created_at"]))
    else:
        segments.append(Segment("running", running, now))
    if status == "failed" and ended is not None and later is not None:
        next_start = later["running_at"] or later["created_at"]
        if ended < next_start:
            segments.append(Segment("delay" if row["step__retry_delay"] else "queued", ended, next_start))
    return segments


def _ended_kind(row: dict[str, Any]) -> str:
    """An ended attempt's kind: succeeded, failed, or failed by its ``timeout_ms``."""
    if row["status"] == "succeeded":
        return "succeeded"
    error = row.get("error")
    kind = error.get("type", "") if isinstance(error, dict) else ""
    return "timeout" if str(kind).endswith(TIMEOUT_TYPES) else "failed"


def run_timeline(run: WorkflowRun) -> SafeString:
    """The run's timeline as an inline ``<svg>`` (two queries: the clock and the attempts)."""
    alias = run._state.db
    clock = WorkflowRun.objects.using(alias).filter(pk=run.pk).annotate(db_now=DbNow())
    now = clock.values_list("db_now", flat=True).first()
    rows = (
        WorkflowStepAttempt.objects.using(alias)
        .filter(step__run_id=run.pk)
        .order_by("step__created_at", "step_id", "attempt")
        .values(
            "step_id",
            "attempt",
            "status",
            "holder",
            "created_at",
            "running_at",
            "succeeded_at",
            "failed_at",
            "step__step_name",
            "step__rpc_name",
            "step__retry_delay",
            "error",
        )[: MAX_BARS + 1]
    )
    attempts = [dict(row) for row in rows]
    more = len(attempts) > MAX_BARS
    end = run.updated_at if run.is_finished else (now or run.updated_at)
    return render(bars(attempts[:MAX_BARS], end), run.created_at, end, more=more)


def render(
    drawn: list[Bar], start: datetime.datetime, end: datetime.datetime, *, more: bool = False
) -> SafeString:
    """The SVG of ``drawn`` bars, the axis running from ``start`` to ``end``."""
    if not drawn:
        return mark_safe("<p>No attempts yet.</p>")
    first = min([start, *(s.start for bar in drawn for s in bar.segments)])
    last = max([end, *(s.end for bar in drawn for s in bar.segments)])
    span = max(_ms(first, last), 1)

    def x(at: datetime.datetime) -> float:
        return LABEL_WIDTH + PLOT_WIDTH * _ms(first, at) / span

    rows = [_bar_row(bar, n * ROW_HEIGHT, x) for n, bar in enumerate(drawn)]
    height = len(drawn) * ROW_HEIGHT + 2 * ROW_HEIGHT
    axis = _axis(first, last, span, height)
    legend = format_html_join(
        "",
        '<rect x="{}" y="{}" width="10" height="10" fill="{}"></rect>'
        '<text x="{}" y="{}" font-size="10">{}</text>',
        _legend(height),
    )
    note = format_html("<p>The first {} attempts are drawn.</p>", MAX_BARS) if more else ""
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="pikku-timeline" width="{}" height="{}" '
        'role="img" aria-label="timeline of the run\'s attempts">{}{}{}</svg>{}',
        LABEL_WIDTH + PLOT_WIDTH + 10,
        height + 2 * ROW_HEIGHT,
        format_html_join("", "{}", ((row,) for row in rows)),
        axis,
        legend,
        note,
    )


def _bar_row(bar: Bar, y: int, x: Callable[[datetime.datetime], float]) -> SafeString:
    """
    One bar's row at ``y``: its label, then a rectangle per segment, placed by
    ``x``, each with its kind, times and worker in a ``<title>``.
    """
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
        (
            (
                f"{x(s.start):.1f}",
                y + 3,
                f"{max(x(s.end) - x(s.start), 1.0):.1f}",
                BAR_HEIGHT,
                KINDS[s.kind][1],
                f"{bar.label}: {KINDS[s.kind][0]} {_stamp(s.start)} to {_stamp(s.end)} "
                f"({format_ms(_ms(s.start, s.end))}), worker {bar.holder or '(none)'}",
            )
            for s in bar.segments
        ),
    )
    return format_html(
        '<g class="pikku-bar"><text x="0" y="{}" font-size="11">{}</text>{}</g>',
        y + 13,
        bar.label,
        rects,
    )


def _axis(first: datetime.datetime, last: datetime.datetime, span: int, height: int) -> SafeString:
    """The time axis under the bars: its first and last instants, and the span between them."""
    return format_html(
        '<text x="{}" y="{}" font-size="10">{}</text>'
        '<text x="{}" y="{}" font-size="10" text-anchor="end">{} (+{})</text>',
        LABEL_WIDTH,
        height - ROW_HEIGHT + 4,
        _stamp(first),
        LABEL_WIDTH + PLOT_WIDTH,
        height - ROW_HEIGHT + 4,
        _stamp(last),
        format_ms(span),
    )


def _legend(height: int) -> Iterable[tuple[Any, ...]]:
    for n, (label, colour) in enumerate(KINDS.values()):
        left = (n % 4) * 200
        top = height + (n // 4) * 14 - 6
        yield left, top, colour, left + 14, top + 9, label
