"""
The cockpit's charts, drawn server-side as inline SVG in the timeline's
manner (``admin.timeline``): completed and failed runs per slot as stacked
bars, and the start delay's p50 and p95 per slot, each bar's figure in its
``<title>`` shown on hover. No JavaScript, nothing fetched from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from pikku_django.admin.chart_data import (
    HOUR,
    Series,
    Span,
    bucket_label,
    percentile,
    slot_label,
)
from pikku_django.models import DELAY_COLUMNS

#: Each chart's plot, in px: every span fills the same width.
PLOT_WIDTH = 240
PLOT_HEIGHT = 32
#: Room for the chart's label under the plot.
LABEL_HEIGHT = 12

COLOURS = {
    "completed": "#3c9d5d",
    "failed": "#c8483b",
    "p50": "#3d7fc1",
    "p95": "#9bb7d4",
    "axis": "#c9d3dd",
}

#: One bar: (x, y, width, height, colour, title).
Rect = tuple[str, str, str, str, str, str]


def _svg(kind: str, label: str, rects: list[Rect]) -> SafeString:
    """A chart's ``<svg>``: its bars, a base line, and its label under them (it may run past the bars)."""
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
        rects,
    )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="pikku-chart pikku-chart-{}" width="{}" height="{}" '
        'overflow="visible" role="img" aria-label="{}">{}'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="{}"></line>'
        '<text x="0" y="{}" font-size="9">{}</text></svg>',
        kind,
        PLOT_WIDTH,
        PLOT_HEIGHT + LABEL_HEIGHT,
        label,
        bars,
        PLOT_HEIGHT,
        PLOT_WIDTH,
        PLOT_HEIGHT,
        COLOURS["axis"],
        PLOT_HEIGHT + LABEL_HEIGHT - 2,
        label,
    )


def _bar_width(span: Span) -> float:
    return PLOT_WIDTH / span.slots


def throughput_chart(series: Series) -> SafeString:
    """Completed (below) and failed (above) runs per slot, scaled to the busiest slot."""
    span = series.span
    top = max([slot.completed + slot.failed for slot in series.slots] + [1])
    width = _bar_width(span)
    rects: list[Rect] = []
    for n, slot in enumerate(series.slots):
        base = float(PLOT_HEIGHT)
        for kind, count in (("completed", slot.completed), ("failed", slot.failed)):
            if not count:
                continue
            height = max(PLOT_HEIGHT * count / top, 1.0)
            base -= height
            title = f"{slot_label(slot, span)}: {count} {kind}"
            rects.append(_rect(n * width, base, width, height, COLOURS[kind], title))
    unit = "a minute" if span is HOUR else "a quarter of an hour"
    label = f"{span.name}: {series.completed} completed, {series.failed} failed (tallest bar {top} {unit})"
    return _svg("runs", label, rects)


def delay_chart(series: Series) -> SafeString:
    """Each slot's start delay, p95 behind p50, on the buckets' (logarithmic) scale."""
    span = series.span
    width = _bar_width(span)
    rects: list[Rect] = []
    for n, slot in enumerate(series.slots):
        starts = sum(slot.delays)
        for kind, share in (("p95", 0.95), ("p50", 0.5)):
            index = percentile(slot.delays, share)
            if index is None:
                continue
            height = PLOT_HEIGHT * (index + 1) / len(DELAY_COLUMNS)
            title = f"{slot_label(slot, span)}: start delay {kind} {bucket_label(index)} ({starts} starts)"
            rects.append(_rect(n * width, PLOT_HEIGHT - height, width, height, COLOURS[kind], title))
    return _svg("delay", f"{span.name}: start delay {summary(series)}", rects)


def summary(series: Series) -> str:
    """The span's start delay in words: "p50 ≤ 250 ms, p95 ≤ 1 s", or "none"."""
    delays = series.delays
    p50, p95 = percentile(delays, 0.5), percentile(delays, 0.95)
    if p50 is None or p95 is None:
        return "none measured"
    return f"p50 {bucket_label(p50)}, p95 {bucket_label(p95)}"


def _rect(x: float, y: float, width: float, height: float, colour: str, title: str) -> Rect:
    # A hair narrower than its slot, so neighbouring bars stay apart.
    return (
        f"{x:.1f}",
        f"{y if y > 0 else 0.0:.1f}",
        f"{max(width - 0.5, 0.5):.1f}",
        f"{height:.1f}",
        colour,
        title,
    )


def charts(series: list[Series]) -> SafeString:
    """Each series' two charts (runs, then start delay), one span under the other."""
    return format_html_join("", '<div class="pikku-charts">{}{}</div>', _pairs(series))


def _pairs(series: list[Series]) -> Iterator[tuple[SafeString, SafeString]]:
    for one in series:
        yield throughput_chart(one), delay_chart(one)
