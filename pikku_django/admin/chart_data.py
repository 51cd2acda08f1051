"""
What the cockpit's charts show, read from the per-minute rollup
(``models.WorkflowMinute``), never from the runs: per queue or per workflow,
the last hour minute by minute and the last day a quarter of an hour at a
time, each slot's completed and failed runs and its start delays' buckets.
One query per span, whatever the number of runs, queues or workflows.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from django.db.models import BigIntegerField, ExpressionWrapper, F, Sum
from django.db.models.functions import Mod

from pikku_django.models import DELAY_BOUNDS_MS, DELAY_COLUMNS, Lease, WorkflowMinute

T = TypeVar("T")


@dataclass(frozen=True)
class Span:
    """A chart's span: ``slots`` slots of ``slot_ms`` each, the last one holding now."""

    name: str
    slot_ms: int
    slots: int


HOUR = Span("last hour", 60_000, 60)
DAY = Span("last day", 900_000, 96)
SPANS = (HOUR, DAY)


@dataclass
class Slot:
    """One slot of a chart: its first instant (epoch ms, database clock) and its counts."""

    start: int
    completed: int = 0
    failed: int = 0
    delays: list[int] = field(default_factory=lambda: [0] * len(DELAY_COLUMNS))

    def add(self, completed: int, failed: int, delays: list[int]) -> None:
        self.completed += completed
        self.failed += failed
        self.delays = [mine + theirs for mine, theirs in zip(self.delays, delays, strict=True)]


@dataclass
class Series:
    """A chart's slots, oldest first."""

    span: Span
    slots: list[Slot]

    @property
    def completed(self) -> int:
        return sum(slot.completed for slot in self.slots)

    @property
    def failed(self) -> int:
        return sum(slot.failed for slot in self.slots)

    @property
    def delays(self) -> list[int]:
        """The start delays' buckets over the whole span."""
        return [sum(column) for column in zip(*(slot.delays for slot in self.slots), strict=True)]


def empty(span: Span, now_ms: int) -> Series:
    """``span``'s slots with nothing in them, ending with the one that holds ``now_ms``."""
    last = now_ms - now_ms % span.slot_ms
    return Series(span, [Slot(last - (span.slots - 1 - n) * span.slot_ms) for n in range(span.slots)])


def read_series(
    alias: str, by: str, span: Span, now_ms: int, names: list[str] | None = None
) -> dict[str, Series]:
    """
    ``span``'s series of each ``by`` (``"queue"`` or ``"workflow"``) with
    anything in it, ``names`` only when given: one query, the rollup's
    minutes summed per slot by the database.
    """
    first = empty(span, now_ms).slots[0].start
    minutes = WorkflowMinute.objects.using(alias).filter(minute__gte=first)
    if names is not None:
        minutes = minutes.filter(**{f"{by}__in": names})
    sums: dict[str, Any] = {"c": Sum("completed"), "f": Sum("failed")}
    sums.update({column: Sum(column) for column in DELAY_COLUMNS})
    slot = ExpressionWrapper(F("minute") - Mod("minute", span.slot_ms), output_field=BigIntegerField())
    rows = minutes.order_by().values(by, at=slot).annotate(**sums)
    found: dict[str, Series] = {}
    for row in rows:
        series = found.setdefault(row[by], empty(span, now_ms))
        index = (int(row["at"]) - first) // span.slot_ms
        if 0 <= index < span.slots:
            delays = [int(row[column] or 0) for column in DELAY_COLUMNS]
            series.slots[index].add(int(row["c"] or 0), int(row["f"] or 0), delays)
    return found


def percentile(delays: list[int], share: float) -> int | None:
    """The bucket (its index) that holds the ``share`` (0.5 for p50) of ``delays``; None for none."""
    total = sum(delays)
    if not total:
        return None
    seen = 0
    for index, count in enumerate(delays):
        seen += count
        if seen >= share * total:
            return index
    return len(delays) - 1


def bucket_label(index: int) -> str:
    """A delay bucket as a bound: "≤ 250 ms", "≤ 5 s", "> 1 h"."""
    if index >= len(DELAY_BOUNDS_MS):
        return f"> {_short(DELAY_BOUNDS_MS[-1])}"
    return f"≤ {_short(DELAY_BOUNDS_MS[index])}"


def _short(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    if ms < 3_600_000:
        return f"{ms // 60_000} min"
    return f"{ms // 3_600_000} h"


def slot_label(slot: Slot, span: Span) -> str:
    """A slot's time on the database clock, in UTC: "13:05 UTC", "13:00–13:15 UTC"."""
    start = datetime.datetime.fromtimestamp(slot.start / 1000, tz=datetime.timezone.utc)
    if span.slot_ms == 60_000:
        return f"{start:%H:%M} UTC"
    end = start + datetime.timedelta(milliseconds=span.slot_ms)
    return f"{start:%H:%M}–{end:%H:%M} UTC"


#: What a page has read for its rows, by key (``page_cached``), while it renders.
_PAGE: ContextVar[dict[tuple[str, ...], Any] | None] = ContextVar("pikku_page_reads", default=None)


@contextmanager
def one_read_per_page() -> Iterator[None]:
    """While a page renders, what its rows show is read once for them all (``page_cached``)."""
    token = _PAGE.set({})
    try:
        yield
    finally:
        _PAGE.reset(token)


def page_cached(key: tuple[str, ...], read: Callable[[bool], T]) -> T:
    """
    ``read(True)`` (for every row), once per page under ``key``; outside a
    page (``one_read_per_page``), ``read(False)`` (for one row alone).
    """
    page = _PAGE.get()
    if page is None:
        return read(False)
    if key not in page:
        page[key] = read(True)
    return cast(T, page[key])


def series_of(alias: str, by: str, name: str) -> list[Series]:
    """
    The series of the ``by`` (``"queue"`` or ``"workflow"``) called ``name``,
    one per span (``SPANS``), from one read per span for the whole page.
    """

    def read(every: bool) -> tuple[int, dict[Span, dict[str, Series]]]:
        now = Lease.objects.db_manager(alias).db_now_ms()
        names = None if every else [name]
        return now, {span: read_series(alias, by, span, now, names) for span in SPANS}

    now, found = page_cached(("series", alias, by), read)
    return [found[span].get(name) or empty(span, now) for span in SPANS]
