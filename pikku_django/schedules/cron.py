"""
Five-field cron expressions and their instants in a time zone, with Debian
cron's rule across DST: a job at a fixed time (neither the minute nor the
hour field starts with ``*``) runs once in an hour that repeats, and right
after the gap when its time is skipped; any other job keeps real-time
spacing (it runs at every real instant whose local time matches).
"""

from __future__ import annotations

import bisect
import datetime
import functools
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pikku_django.errors import InvalidArgumentError

UTC = datetime.timezone.utc

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: (name, lowest, highest, names) per field.
FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, MONTHS),
    ("day-of-week", 0, 7, DAYS),
)
#: The most days each month can have (February: 29, in leap years).
LONGEST = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
#: The Gregorian calendar (weekdays too) repeats every 400 years, so an
#: expression that matches at all matches within any 400 years (a Sunday
#: 1 January can be 11 years away, a Sunday 29 February 40).
SEARCH_YEARS = 400
#: Fields are split on ASCII spaces and tabs only, as Debian cron does.
FIELD_SEPARATOR = re.compile(r"[ \t]+")


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the allowed values of each field, sorted."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 is Sunday
    #: Debian: when either day field starts with "*", a day must match both; else either.
    days_and: bool
    #: Debian's "wildcard" job (its minute or hour field starts with "*"): real-time spacing.
    wildcard: bool

    def day_matches(self, day: datetime.date) -> bool:
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        return (dom and dow) if self.days_and else (dom or dow)

    def next_wall(self, start: datetime.datetime) -> datetime.datetime:
        """The first naive wall time at or after ``start`` (whole minutes) that matches."""
        wall = start.replace(second=0, microsecond=0)
        if wall < start:
            wall += datetime.timedelta(minutes=1)
        limit = wall.year + SEARCH_YEARS
        while wall.year <= limit:
            if wall.month not in self.months:
                i = bisect.bisect_right(self.months, wall.month)
                year, month = (
                    (wall.year, self.months[i]) if i < len(self.months) else (wall.year + 1, self.months[0])
                )
                wall = datetime.datetime(year, month, 1)
                continue
            if not self.day_matches(wall.date()):
                wall = datetime.datetime.combine(wall.date() + datetime.timedelta(days=1), datetime.time())
                continue
            if wall.hour not in self.hours:
                i = bisect.bisect_right(self.hours, wall.hour)
                if i == len(self.hours):
                    wall = datetime.datetime.combine(
                        wall.date() + datetime.timedelta(days=1), datetime.time()
                    )
                else:
                    wall = wall.replace(hour=self.hours[i], minute=0)
                continue
            if wall.minute not in self.minutes:
                i = bisect.bisect_right(self.minutes, wall.minute)
                if i == len(self.minutes):
                    wall = wall.replace(minute=0) + datetime.timedelta(hours=1)
                else:
                    wall = wall.replace(minute=self.minutes[i])
                continue
            return wall
        raise InvalidArgumentError(f"cron {self.expression!r} matches no time in {SEARCH_YEARS} years.")


def _number(field: str, text: str, names: list[str] | None) -> int:
    if names is not None and text.upper() in names:
        return names.index(text.upper()) + (1 if names is MONTHS else 0)
    if not (text.isascii() and text.isdigit()):
        named = "" if names is None else f" or a name ({names[0]}-{names[-1]})"
        raise InvalidArgumentError(f"cron's {field} field has {text!r}, which is not a number{named}.")
    return int(text)


def _field(index: int, text: str) -> set[int]:
    field, low, high, names = FIELDS[index]
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
                raise InvalidArgumentError(f"cron's {field} field has a bad step in {part!r}.")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _number(field, a, names), _number(field, b, names)
        else:
            first = _number(field, base, names)
            # "5/15" is "5-59/15", as most cron implementations read it.
            last = high if slash else first
        for value in (first, last):
            if not low <= value <= high:
                raise InvalidArgumentError(f"cron's {field} field has {value}, outside {low}-{high}.")
        if first > last:
            raise InvalidArgumentError(f"cron's {field} field has the range {base!r}, which runs backwards.")
        values.update(range(first, last + 1, step))
    return values


@functools.lru_cache(maxsize=256)
def parse(expression: object) -> Cron:
    """Parse a five-field expression (or an ``@daily``-style macro); ``InvalidArgumentError`` if bad."""
    if not isinstance(expression, str):
        raise InvalidArgumentError(f"cron must be a str, not {type(expression).__name__}.")
    text = MACROS.get(expression.strip(" \t").lower(), expression)
    parts = FIELD_SEPARATOR.split(text.strip(" \t"))
    if text.startswith("@"):
        known = ", ".join(sorted(MACROS))
        raise InvalidArgumentError(f"cron {expression!r} is not a known macro; the macros are {known}.")
    if len(parts) != 5:
        raise InvalidArgumentError(
            f"cron {expression!r} has {len(parts)} fields; it needs 5 (minute hour day month weekday)."
        )
    minutes, hours, days, months, weekdays = (_field(i, part) for i, part in enumerate(parts))
    weekdays = {day % 7 for day in weekdays}
    days_and = parts[2].startswith("*") or parts[4].startswith("*")
    if days_and and min(days) > max(LONGEST[m - 1] for m in months):
        raise InvalidArgumentError(f"cron {expression!r} names a day that none of its months has.")
    cron = Cron(
        expression=expression,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=tuple(sorted(days)),
        months=tuple(sorted(months)),
        weekdays=frozenset(weekdays),
        days_and=days_and,
        wildcard=parts[0].startswith("*") or parts[1].startswith("*"),
    )
    # Proven at parse time: one that matches nothing in a whole cycle never will.
    cron.next_wall(datetime.datetime(2000, 1, 1))
    return cron


@functools.lru_cache(maxsize=256)
def zone(name: str) -> datetime.tzinfo:
    """The IANA time zone ``name``; ``InvalidArgumentError`` if unknown."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"timezone must be an IANA name such as 'Europe/Helsinki', not {name!r}.")
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgumentError(f"timezone {name!r} is not a known IANA time zone.") from None


def _offset(tz: datetime.tzinfo, epoch_s: int) -> datetime.timedelta:
    return datetime.datetime.fromtimestamp(epoch_s, tz).utcoffset() or datetime.timedelta()


def _next_change(
    tz: datetime.tzinfo, start: datetime.datetime, end: datetime.datetime
) -> datetime.datetime | None:
    """
    The first instant in (start, end] whose UTC offset differs from start's
    (zones change offset on whole seconds, and never twice within a day).
    """
    low, last = int(start.timestamp()), int(end.timestamp())
    offset = _offset(tz, low)
    while low < last:
        high = min(low + 86_400, last)
        if _offset(tz, high) != offset:
            while high - low > 1:
                middle = (low + high) // 2
                if _offset(tz, middle) == offset:
                    low = middle
                else:
                    high = middle
            return datetime.datetime.fromtimestamp(high, UTC)
        low = high
    return None


def _next_real(cron: Cron, tz: datetime.tzinfo, after: datetime.datetime) -> datetime.datetime:
    """Real-time spacing: the first instant > after whose local wall time matches."""
    start, strict = after, True
    while True:
        offset = _offset(tz, int(start.timestamp()))
        wall = (start + offset).replace(tzinfo=None)
        found = cron.next_wall(wall + datetime.timedelta(microseconds=1) if strict else wall)
        candidate = (found - offset).replace(tzinfo=UTC)
        change = None if tz is UTC else _next_change(tz, start, candidate)
        if change is None:
            return candidate
        # The offset changes before the candidate: look again from the change.
        start, strict = change, False


def _resolve_fixed(tz: datetime.tzinfo, wall: datetime.datetime) -> datetime.datetime:
    """A fixed-time job's instant for a local wall time: the first of two; in a gap, its end."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # The wall time was skipped: read with the offsets before and after the
    # gap, it brackets the change; the job runs right after the gap.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    change = _next_change(tz, min(first, other), max(first, other))
    assert change is not None
    return change


def _next_fixed(cron: Cron, tz: datetime.tzinfo, after: datetime.datetime) -> datetime.datetime:
    wall = after.astimezone(tz).replace(tzinfo=None)
    while True:
        wall = cron.next_wall(wall + datetime.timedelta(microseconds=1))
        instant = _resolve_fixed(tz, wall)
        if instant > after:
            return instant


def next_after(cron: Cron, tz: datetime.tzinfo, after: datetime.datetime) -> datetime.datetime:
    """The first instant of ``cron`` in ``tz`` strictly after the aware ``after`` (aware UTC)."""
    after = after.astimezone(UTC)
    if tz is UTC or cron.wildcard:
        return _next_real(cron, tz, after)
    return _next_fixed(cron, tz, after)


@functools.lru_cache(maxsize=4096)
def next_after_ms(expression: str, timezone: str, after_ms: int) -> int:
    """``next_after`` in epoch milliseconds, cached: the scheduler asks it on every pass."""
    after = datetime.datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    return int(next_after(parse(expression), zone(timezone), after).timestamp() * 1000)


def ticks(cron: str, timezone: str, after: datetime.datetime, count: int) -> list[datetime.datetime]:
    """The next ``count`` instants of ``cron`` in ``timezone`` after the aware ``after``, in UTC."""
    parsed, tz = parse(cron), zone(timezone)
    if not isinstance(after, datetime.datetime) or after.utcoffset() is None:
        raise InvalidArgumentError(f"after must be an aware datetime, not {after!r}.")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidArgumentError(f"count must be an int >= 0, not {count!r}.")
    found: list[datetime.datetime] = []
    for _ in range(count):
        after = next_after(parsed, tz, after)
        found.append(after)
    return found
