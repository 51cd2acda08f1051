"""
Crons that match rarely are found (the 400-year Gregorian cycle), fields
split on ASCII spaces and tabs only, and one schedule whose instants cannot
be found never stops the others.
"""

from __future__ import annotations

import datetime

import pytest
from django.test import SimpleTestCase, TestCase, override_settings

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowSchedule
from pikku_django.schedules import tick, ticks
from pikku_django.schedules.cron import parse
from tests.support.schedules import HOUR_MS, age, hourly_away

UTC = datetime.timezone.utc


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


class RareCronTests(SimpleTestCase):
    def test_new_year_on_a_sunday_eleven_years_apart(self) -> None:
        assert ticks("0 0 1 1 */7", "UTC", at(2051, 1, 2), 2) == [at(2062, 1, 1), at(2068, 1, 1)]

    def test_a_leap_day_on_a_sunday_across_a_skipped_leap_year(self) -> None:
        # 2100 is no leap year: from 2089 the next Sunday 29 February is 2128.
        assert ticks("0 0 29 2 */7", "UTC", at(2089, 1, 1), 1) == [at(2128, 2, 29)]


class FieldSplitTests(SimpleTestCase):
    def test_tabs_and_spaces_separate_fields(self) -> None:
        assert parse("0\t2  * *\t*").hours == (2,)

    def test_other_unicode_whitespace_is_refused(self) -> None:
        for text in ("0\u00a02 * * *", "0 2\u2003* * *", "0 2 * *\u3000*"):
            with pytest.raises(InvalidArgumentError):
                parse(text)


class OwnScheduleTests(TestCase):
    def test_a_schedule_whose_ticks_cannot_be_found_never_stops_the_others(self) -> None:
        cron, past = hourly_away()
        setting = {
            "broken": {"workflow": "test.scheduled", "cron": cron},
            "report": {"workflow": "test.scheduled", "cron": cron},
        }
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
            age("broken", past - HOUR_MS)
            age("report", past - HOUR_MS)
            # A row whose cron no longer parses (written by hand, or by an older version).
            WorkflowSchedule.objects.filter(name="broken").update(cron="0 0 30 2 *")
            with self.assertLogs("pikku_django.schedules.ledger", "ERROR") as logs:
                recorded = tick()
        assert [row.schedule.name for row in recorded] == ["report"]
        assert any("'broken'" in line for line in logs.output), logs.output
