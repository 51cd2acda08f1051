"""A manual tick never takes a cron's instant, and a pass that meets a recorded tick records the rest."""

from __future__ import annotations

from django.test import TestCase, override_settings

from pikku_django import schedules
from pikku_django.models import WorkflowSchedule, WorkflowScheduleTick
from pikku_django.schedules import tick
from tests.support.schedules import HOUR_MS, age, db_now_ms, hourly_away, ledger


def every(cron: str, **options: object) -> dict[str, object]:
    return {"report": {"workflow": "test.scheduled", "cron": cron, **options}}


class ManualTickTests(TestCase):
    def test_a_manual_tick_never_takes_a_whole_second(self) -> None:
        cron, _ = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            schedule = WorkflowSchedule.objects.get(name="report")
            # Every instant of the next 1.5 s but the whole seconds is taken: a
            # trigger in them may take only a whole second, which a cron could produce.
            start = db_now_ms()
            WorkflowScheduleTick.objects.bulk_create(
                WorkflowScheduleTick(schedule=schedule, tick_at=at, manual=True)
                for at in range(start, start + 1500)
                if at % 1000
            )
            row = schedules.trigger("report")
        assert row.manual and row.tick_at % 1000 != 0 and row.tick_at >= start

    def test_a_pass_that_meets_a_recorded_tick_records_the_rest(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, catch_up="all")):
            tick()
            schedule = age("report", past - 3 * HOUR_MS)
            # A manual tick on a cron instant not yet recorded (as a trigger
            # could take before): the pass records every other tick.
            WorkflowScheduleTick.objects.create(schedule=schedule, tick_at=past - HOUR_MS, manual=True)
            recorded = tick()
            assert tick() == []
        assert [row.tick_at for row in recorded] == [past - 2 * HOUR_MS, past]
        assert [(at, manual) for at, _, manual in ledger("report")] == [
            (past - 3 * HOUR_MS, False),
            (past - 2 * HOUR_MS, False),
            (past - HOUR_MS, True),
            (past, False),
        ]

    def test_a_schedule_that_cannot_advance_is_logged_at_warning(self) -> None:
        cron, past = hourly_away()
        other, other_past = hourly_away(40)
        setting = {**every(cron), "other": {"workflow": "test.scheduled", "cron": other}}
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
            schedule = age("report", past - HOUR_MS)
            age("other", other_past - HOUR_MS)
            WorkflowScheduleTick.objects.create(schedule=schedule, tick_at=past, manual=True)
            with self.assertLogs("pikku_django.schedules.ledger", "WARNING") as logs:
                recorded = tick()
        assert [row.schedule.name for row in recorded] == ["other"]
        assert any("WARNING" in line and "'report'" in line for line in logs.output), logs.output
