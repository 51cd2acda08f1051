"""What the checks refuse up front, and what one bad entry may not stop."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from django.core.checks import WARNING
from django.core.management import call_command
from django.db import connection
from django.test import SimpleTestCase, TestCase, override_settings

from pikku_django.checks import check_schedules
from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowSchedule
from pikku_django.schedules import config, syncing, tick
from pikku_django.schedules.cron import parse
from tests.support.schedules import HOUR_MS, age, hourly_away

GOOD = {"workflow": "test.scheduled", "cron": "0 2 * * *"}
#: A cron that parses and is longer than the column (255 characters) can hold.
LONG_CRON = ",".join(["0"] * 130) + " 2 * * *"


def ids(value: object) -> list[tuple[str, str]]:
    with override_settings(PIKKU_SCHEDULES=value):
        _, bad = config.read()
    return [(check_id, message) for problems in bad.values() for check_id, message, _ in problems]


class ColumnLimitTests(SimpleTestCase):
    def test_a_cron_longer_than_its_column_is_refused(self) -> None:
        assert len(LONG_CRON) > 255
        found = ids({"a": {**GOOD, "cron": LONG_CRON}})
        assert [i for i, _ in found] == [config.CRON_ID], found
        assert "255" in found[0][1]

    def test_a_task_path_longer_than_its_column_is_refused(self) -> None:
        path = "testproject." + "x" * 250 + ".add"
        found = ids({"a": {"task": path, "cron": "* * * * *"}})
        assert [i for i, _ in found] == [config.TARGET_ID], found
        assert "255" in found[0][1]


class OneBadEntryTests(TestCase):
    def test_a_long_cron_is_skipped_and_the_others_tick(self) -> None:
        cron, past = hourly_away()
        good = {"report": {**GOOD, "cron": cron}}
        with override_settings(PIKKU_SCHEDULES=good):
            tick()
            age("report", past - HOUR_MS)
        with override_settings(PIKKU_SCHEDULES={**good, "long": {**GOOD, "cron": LONG_CRON}}):
            recorded = tick()
        assert [row.schedule.name for row in recorded] == ["report"]
        assert not WorkflowSchedule.objects.filter(name="long").exists()

    def test_an_entry_the_database_refuses_is_logged_and_the_others_sync(self) -> None:
        cron, _ = hourly_away()
        long_workflow = "w" * 300
        entries = {
            "long": config.ScheduleEntry(
                workflow=long_workflow,
                task="",
                cron=cron,
                timezone="UTC",
                input=None,
                queue="",
                priority=None,
                catch_up="latest",
                catch_up_window_ms=86_400_000,
                overlap="allow",
            ),
            "report": config.ScheduleEntry(
                workflow="test.scheduled",
                task="",
                cron=cron,
                timezone="UTC",
                input=None,
                queue="",
                priority=None,
                catch_up="latest",
                catch_up_window_ms=86_400_000,
                overlap="allow",
            ),
        }
        with (
            self.assertLogs("pikku_django.schedules.syncing", "ERROR")
            if connection.vendor != "sqlite"
            else nullcontext()
        ):
            syncing.write("default", [], entries, set(), "a long one")
        assert WorkflowSchedule.objects.filter(name="report").exists()


class MissingTargetTests(SimpleTestCase):
    # Django 6.1's `check` asks each database whether it supports JSONField.
    databases = {"default"}

    def test_an_unknown_workflow_or_task_is_a_warning_that_stops_nothing(self) -> None:
        for entry in (
            {**GOOD, "workflow": "no.such"},
            {"task": "testproject.testing.tasks.nope", "cron": "* * * * *"},
            {"task": "not_installed.tasks.job", "cron": "* * * * *"},
        ):
            with override_settings(PIKKU_SCHEDULES={"typo": entry}):
                messages = [m for m in check_schedules() if "typo" in m.msg]
                assert [(m.id, m.level) for m in messages] == [("pikku_django.W031", WARNING)], entry
                call_command("check")  # a warning: migrate and runserver go on

    def test_cron_messages_say_what_is_wrong(self) -> None:
        ((check_id, message),) = ids({"a": {**GOOD, "cron": "@minutely"}})
        assert check_id == config.CRON_ID and "not a known macro" in message and "@hourly" in message
        with pytest.raises(InvalidArgumentError, match=r"not a number or a name \(JAN-DEC\)"):
            parse("0 0 1 MOM *")
