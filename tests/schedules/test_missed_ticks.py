"""Missed ticks, made precise: every one recorded back to the last, and one catch-up run under latest."""

from __future__ import annotations

from django.test import TestCase, override_settings

from pikku_django import schedules
from pikku_django.models import WorkflowRun
from pikku_django.schedules import tick
from tests.support.schedules import HOUR_MS, MINUTE_MS, age, daily_away, db_now_ms, hourly_away, ledger

DAY_MS = 24 * HOUR_MS


def every(cron: str, **options: object) -> dict[str, object]:
    return {"report": {"workflow": "test.scheduled", "cron": cron, **options}}


class EveryMissedTickTests(TestCase):
    def test_a_daily_schedule_down_three_days_records_each_day(self) -> None:
        cron, past = daily_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, catch_up="none")):
            tick()
            age("report", past - 3 * DAY_MS)
            recorded = tick()
            assert tick() == []
        assert [row.tick_at for row in recorded] == [past - n * DAY_MS for n in (2, 1, 0)]
        assert {row.skipped for row in recorded} == {"catch_up"}

    def test_an_hourly_schedule_down_thirty_hours_records_every_hour(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past - 30 * HOUR_MS)
            recorded = tick()
        assert [row.tick_at for row in recorded] == [past - n * HOUR_MS for n in range(29, -1, -1)]
        assert [row.skipped for row in recorded] == ["catch_up"] * 29 + [""]

    def test_only_the_newest_thousand_are_recorded(self) -> None:
        minute = db_now_ms() // MINUTE_MS * MINUTE_MS
        with override_settings(PIKKU_SCHEDULES=every("* * * * *", catch_up="none")):
            tick()
            age("report", minute - 3 * DAY_MS)
            first = tick()
            assert len(first) == schedules.MAX_TICKS_PER_PASS
            second = tick()
        # The newest thousand, one minute apart, up to this minute (or one
        # that turned meanwhile); the older ones are passed over.
        ats = [row.tick_at for row in first]
        assert ats == [ats[0] + n * MINUTE_MS for n in range(len(ats))]
        assert ats[-1] >= minute
        assert all(row.tick_at > ats[-1] for row in second) and len(second) <= 1
        assert len(ledger("report")) == 1 + len(first) + len(second)


class LatestTests(TestCase):
    def test_latest_runs_one_catch_up_run_when_the_newest_tick_is_on_time(self) -> None:
        now = db_now_ms()
        minute = now // MINUTE_MS * MINUTE_MS
        with override_settings(PIKKU_SCHEDULES=every("* * * * *")):
            tick()
            age("report", minute - 5 * MINUTE_MS)
            recorded = tick()
        # Four missed minutes more than 60 s late, and this minute's on time:
        # one catch-up run, the newest's, never two back to back.
        assert [row.skipped for row in recorded[:-1]] == ["catch_up"] * (len(recorded) - 1)
        assert recorded[-1].skipped == "" and recorded[-1].run_id is not None
        assert WorkflowRun.objects.count() == 1
