"""ticks(): cron instants in UTC and across DST by Debian cron's rule; expected instants by hand."""

from __future__ import annotations

import datetime

import pytest
from django.test import SimpleTestCase

from pikku_django.errors import InvalidArgumentError
from pikku_django.schedules import ticks
from pikku_django.schedules.cron import parse

UTC = datetime.timezone.utc


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


class UtcTests(SimpleTestCase):
    def test_every_fifteen_minutes(self) -> None:
        got = ticks("*/15 * * * *", "UTC", at(2026, 1, 1, 0, 7), 4)
        assert got == [
            at(2026, 1, 1, 0, 15),
            at(2026, 1, 1, 0, 30),
            at(2026, 1, 1, 0, 45),
            at(2026, 1, 1, 1, 0),
        ]
        assert all(t.tzinfo is UTC for t in got)

    def test_strictly_after(self) -> None:
        assert ticks("0 2 * * *", "UTC", at(2026, 1, 1, 2, 0), 1) == [at(2026, 1, 2, 2, 0)]
        assert ticks("0 2 * * *", "UTC", at(2026, 1, 1, 1, 59, 59, 999_000), 1) == [at(2026, 1, 1, 2, 0)]

    def test_weekdays_names_and_sunday_as_seven(self) -> None:
        # 2026-12-04 is a Friday.
        assert ticks("0 9 * * MON-FRI", "UTC", at(2026, 12, 4, 10), 2) == [
            at(2026, 12, 7, 9),
            at(2026, 12, 8, 9),
        ]
        assert ticks("0 0 * * 7", "UTC", at(2026, 12, 4), 1) == ticks(
            "0 0 * * SUN", "UTC", at(2026, 12, 4), 1
        )
        assert ticks("0 0 * * 0", "UTC", at(2026, 12, 4), 1) == [at(2026, 12, 6)]

    def test_day_fields_or_unless_one_starts_with_a_star(self) -> None:
        # Debian: the 13th OR any Friday; "*/1" for the day makes it AND (every Friday).
        assert ticks("0 0 13 * FRI", "UTC", at(2026, 12, 1), 2) == [at(2026, 12, 4), at(2026, 12, 11)]
        assert ticks("0 0 */1 * FRI", "UTC", at(2026, 12, 1), 2) == [at(2026, 12, 4), at(2026, 12, 11)]
        assert ticks("0 0 13 * *", "UTC", at(2026, 12, 1), 1) == [at(2026, 12, 13)]

    def test_february_29th_and_month_ends(self) -> None:
        assert ticks("0 0 29 2 *", "UTC", at(2026, 1, 1), 2) == [at(2028, 2, 29), at(2032, 2, 29)]
        assert ticks("0 0 31 * *", "UTC", at(2026, 4, 1), 2) == [at(2026, 5, 31), at(2026, 7, 31)]

    def test_macros_and_steps_from_a_start(self) -> None:
        assert ticks("@hourly", "UTC", at(2026, 1, 1, 0, 30), 1) == [at(2026, 1, 1, 1)]
        assert ticks("@daily", "UTC", at(2026, 1, 1, 0, 30), 1) == [at(2026, 1, 2)]
        assert ticks("5/20 * * * *", "UTC", at(2026, 1, 1), 3) == [
            at(2026, 1, 1, 0, 5),
            at(2026, 1, 1, 0, 25),
            at(2026, 1, 1, 0, 45),
        ]
        assert ticks("0 0 * * *", "UTC", at(2026, 1, 1), 0) == []


class NewYorkTests(SimpleTestCase):
    """America/New_York: 2026-03-08 02:00 EST becomes 03:00 EDT; 2026-11-01 02:00 EDT becomes 01:00 EST."""

    zone = "America/New_York"

    def test_fixed_time_in_the_skipped_hour_runs_right_after_the_gap(self) -> None:
        got = ticks("30 2 * * *", self.zone, at(2026, 3, 7, 12), 3)
        # 02:30 EST on the 7th was 07:30Z; on the 8th 02:30 does not exist: 03:00 EDT = 07:00Z.
        assert got == [at(2026, 3, 8, 7, 0), at(2026, 3, 9, 6, 30), at(2026, 3, 10, 6, 30)]

    def test_two_fixed_times_in_the_gap_run_once(self) -> None:
        got = ticks("0,30 2 * * *", self.zone, at(2026, 3, 8, 5), 2)
        assert got == [at(2026, 3, 8, 7, 0), at(2026, 3, 9, 6, 0)]

    def test_fixed_time_in_the_repeated_hour_runs_once(self) -> None:
        got = ticks("30 1 * * *", self.zone, at(2026, 10, 31, 12), 3)
        # 01:30 EDT = 05:30Z on Nov 1; not again at 01:30 EST (06:30Z); then 01:30 EST daily.
        assert got == [at(2026, 11, 1, 5, 30), at(2026, 11, 2, 6, 30), at(2026, 11, 3, 6, 30)]

    def test_hourly_keeps_real_time_spacing(self) -> None:
        fall = ticks("0 * * * *", self.zone, at(2026, 11, 1, 3, 30), 4)
        # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST.
        assert fall == [at(2026, 11, 1, 4), at(2026, 11, 1, 5), at(2026, 11, 1, 6), at(2026, 11, 1, 7)]
        spring = ticks("0 * * * *", self.zone, at(2026, 3, 8, 4, 30), 3)
        # 00:00 EST, 01:00 EST, then 03:00 EDT: one real hour apart each.
        assert spring == [at(2026, 3, 8, 5), at(2026, 3, 8, 6), at(2026, 3, 8, 7)]

    def test_a_star_in_the_minute_field_runs_in_both_repeated_hours(self) -> None:
        got = ticks("*/30 1 * * *", self.zone, at(2026, 11, 1, 4), 5)
        assert got == [
            at(2026, 11, 1, 5, 0),
            at(2026, 11, 1, 5, 30),
            at(2026, 11, 1, 6, 0),
            at(2026, 11, 1, 6, 30),
            at(2026, 11, 2, 6, 0),
        ]

    def test_a_start_in_the_repeated_hour(self) -> None:
        # After 01:40 EST (06:40Z): 01:30 of that day has passed (at 05:30Z).
        assert ticks("30 1 * * *", self.zone, at(2026, 11, 1, 6, 40), 1) == [at(2026, 11, 2, 6, 30)]
        # After 01:10 EST (06:10Z): the job ran at 01:30 EDT, and not again.
        assert ticks("30 1 * * *", self.zone, at(2026, 11, 1, 6, 10), 1) == [at(2026, 11, 2, 6, 30)]


class HelsinkiTests(SimpleTestCase):
    """Europe/Helsinki: 2026-03-29 03:00 EET becomes 04:00 EEST; 2026-10-25 04:00 EEST becomes 03:00 EET."""

    zone = "Europe/Helsinki"

    def test_spring_forward(self) -> None:
        got = ticks("30 3 * * *", self.zone, at(2026, 3, 28, 12), 2)
        # 03:30 does not exist on the 29th: 04:00 EEST = 01:00Z; then 03:30 EEST = 00:30Z.
        assert got == [at(2026, 3, 29, 1, 0), at(2026, 3, 30, 0, 30)]

    def test_fall_back(self) -> None:
        got = ticks("30 3 * * *", self.zone, at(2026, 10, 24, 12), 2)
        # 03:30 EEST = 00:30Z on the 25th, once; then 03:30 EET = 01:30Z.
        assert got == [at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30)]

    def test_every_fifteen_minutes_across_the_fall(self) -> None:
        got = ticks("*/15 * * * *", self.zone, at(2026, 10, 25, 0, 50), 5)
        # 03:50 EEST, then 03:00, 03:15, 03:30, 03:45 EET and 04:00 EET: 15 real minutes apart.
        assert got == [
            at(2026, 10, 25, 1, 0),
            *(at(2026, 10, 25, 1, m) for m in (15, 30, 45)),
            at(2026, 10, 25, 2),
        ]

    def test_other_days_are_plain(self) -> None:
        assert ticks("0 9 * * *", self.zone, at(2026, 12, 1), 1) == [at(2026, 12, 1, 7)]
        assert ticks("0 9 * * *", self.zone, at(2026, 7, 1), 1) == [at(2026, 7, 1, 6)]


class RefusalTests(SimpleTestCase):
    def test_bad_expressions_name_the_problem(self) -> None:
        for cron, words in [
            ("* * * *", "4 fields"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day-of-month"),
            ("* * * 13 *", "month"),
            ("* * * * 8", "day-of-week"),
            ("*/0 * * * *", "step"),
            ("5-1 * * * *", "backwards"),
            ("a * * * *", "not a number"),
            ("\u00b2 * * * *", "not a number"),
            ("0 0 30 2 *", "none of its months"),
            ("@reboot", "not a known macro"),
        ]:
            with pytest.raises(InvalidArgumentError, match=words):
                parse(cron)

    def test_bad_arguments(self) -> None:
        with pytest.raises(InvalidArgumentError, match="timezone"):
            ticks("* * * * *", "Mars/Olympus", at(2026, 1, 1), 1)
        with pytest.raises(InvalidArgumentError, match="after"):
            ticks("* * * * *", "UTC", datetime.datetime(2026, 1, 1), 1)
        for count in (-1, 1.5, True):
            with pytest.raises(InvalidArgumentError, match="count"):
                ticks("* * * * *", "UTC", at(2026, 1, 1), count)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="cron"):
            ticks(None, "UTC", at(2026, 1, 1), 1)  # type: ignore[arg-type]
