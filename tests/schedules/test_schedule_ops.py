"""The schedules' checks, the pikku_schedules command and the schedule admin."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import SimpleTestCase, TestCase, override_settings
from django.urls import reverse

from pikku_django import schedules
from pikku_django.admin import WorkflowScheduleAdmin
from pikku_django.checks import check_schedules
from pikku_django.models import WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from tests.support.schedules import HOUR_MS, age, hourly_away

GOOD = {"workflow": "test.scheduled", "cron": "0 2 * * *"}


def ids(value: object) -> list[tuple[str, str]]:
    with override_settings(PIKKU_SCHEDULES=value):
        return [(error.id, error.msg) for error in check_schedules()]


class CheckTests(SimpleTestCase):
    databases = {"default"}

    def test_good_entries_pass(self) -> None:
        assert ids({}) == []
        assert (
            ids(
                {
                    "a": GOOD,
                    "b": {**GOOD, "timezone": "Europe/Helsinki", "catch_up": "all", "overlap": "skip"},
                }
            )
            == []
        )
        assert (
            ids(
                {
                    "t": {
                        "task": "testproject.testing.tasks.add",
                        "cron": "*/5 * * * *",
                        "input": {"a": 1, "b": 2},
                    }
                }
            )
            == []
        )

    def test_each_problem_has_its_id_and_names_the_entry(self) -> None:
        cases = [
            ([], "pikku_django.E030"),
            ({"a": "0 2 * * *"}, "pikku_django.E030"),
            ({"": GOOD}, "pikku_django.E030"),
            ({"x" * 201: GOOD}, "pikku_django.E030"),
            ({"a": {"cron": "0 2 * * *"}}, "pikku_django.E031"),
            ({"a": {**GOOD, "task": "testproject.testing.tasks.add"}}, "pikku_django.E031"),
            ({"a": {**GOOD, "workflow": "no.such"}}, "pikku_django.W031"),
            ({"a": {"task": "testproject.testing.tasks.nope", "cron": "* * * * *"}}, "pikku_django.W031"),
            (
                {"a": {"task": "testproject.testing.workflows.plain_step", "cron": "* * * * *"}},
                "pikku_django.E031",
            ),
            ({"a": {**GOOD, "cron": "0 2 * *"}}, "pikku_django.E032"),
            ({"a": {**GOOD, "cron": "0 25 * * *"}}, "pikku_django.E032"),
            ({"a": {**GOOD, "timezone": "Europe/Nowhere"}}, "pikku_django.E033"),
            ({"a": {**GOOD, "when": "soon"}}, "pikku_django.E034"),
            ({"a": {**GOOD, "catch_up": "some"}}, "pikku_django.E035"),
            ({"a": {**GOOD, "overlap": "queue"}}, "pikku_django.E035"),
            ({"a": {**GOOD, "catch_up_window_ms": 0}}, "pikku_django.E035"),
            ({"a": {**GOOD, "catch_up_window_ms": 32 * 86_400_000}}, "pikku_django.E035"),
            ({"a": {**GOOD, "priority": "high"}}, "pikku_django.E035"),
            ({"a": {**GOOD, "queue": ""}}, "pikku_django.E035"),
            ({"a": {**GOOD, "input": {1, 2}}}, "pikku_django.E035"),
            (
                {"a": {"task": "testproject.testing.tasks.add", "cron": "* * * * *", "input": [1]}},
                "pikku_django.E035",
            ),
        ]
        for value, check_id in cases:
            found = ids(value)
            assert [i for i, _ in found] == [check_id], (value, found)
            if isinstance(value, dict) and value:
                (name,) = value
                assert repr(name)[:30].rstrip("'") in found[0][1], found

    def test_every_bad_entry_is_named(self) -> None:
        found = ids({"a": {**GOOD, "cron": "bad"}, "b": {**GOOD, "timezone": "Nowhere"}, "c": GOOD})
        assert [(i, m.split("]")[0]) for i, m in found] == [
            ("pikku_django.E032", "PIKKU_SCHEDULES['a'"),
            ("pikku_django.E033", "PIKKU_SCHEDULES['b'"),
        ]

    def test_call_command_check_fails(self) -> None:
        with (
            override_settings(PIKKU_SCHEDULES={"nightly": {**GOOD, "cron": "nope"}}),
            pytest.raises(SystemCheckError, match="E032"),
        ):
            call_command("check")


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("pikku_schedules", *args, stdout=out)
    return out.getvalue()


class CommandTests(TestCase):
    def setUp(self) -> None:
        self.cron, self.past = hourly_away()
        self.settings = override_settings(
            PIKKU_SCHEDULES={
                "report": {"workflow": "test.scheduled", "cron": self.cron, "timezone": "Europe/Helsinki"}
            }
        )
        self.settings.enable()
        self.addCleanup(self.settings.disable)

    def test_list_syncs_and_shows_the_next_ticks(self) -> None:
        out = command()
        assert out.startswith(
            f"report: workflow test.scheduled, {self.cron!r} in Europe/Helsinki, active; next "
        )
        assert out.rstrip().endswith("last never")
        (listed,) = json.loads(command("--json"))
        assert listed["name"] == "report" and listed["state"] == "active" and listed["last_tick"] is None
        assert len(listed["next_ticks"]) == 3
        assert listed["next_ticks"][0] > listed["db_now"]

    def test_trigger_pause_resume(self) -> None:
        out = command("--trigger", "report")
        assert out.startswith("Triggered report: a manual tick at ") and ", run " in out
        (row,) = WorkflowScheduleTick.objects.all()
        assert row.manual and WorkflowRun.objects.filter(pk=row.run_id).exists()
        (listed,) = json.loads(command("--json"))
        assert listed["last_tick"]["manual"] is True and listed["last_tick"]["run_status"] == "running"
        assert "manual, run running" in command()
        assert command("--pause", "report") == "Paused report.\n"
        assert command("--pause", "report") == "report was paused already; nothing changed.\n"
        assert ", paused; next -;" in command()
        assert command("--resume", "report") == "Resumed report.\n"
        assert command("--resume", "report") == "report was not paused; nothing changed.\n"
        assert command("--pause", "report", "-v", "0") == ""
        triggered = json.loads(command("--trigger", "report", "--json"))
        assert triggered["schedule"] == "report" and triggered["run"]

    def test_unknown_name_is_an_error_naming_it(self) -> None:
        for option in ("--trigger", "--pause", "--resume"):
            with pytest.raises(CommandError, match="Schedule 'nope'"):
                command(option, "nope")

    def test_options_exclude_each_other(self) -> None:
        with pytest.raises(CommandError):
            command("--pause", "report", "--resume", "report")


class AdminTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.url = reverse("admin:pikku_django_workflowschedule_changelist")
        cron, past = hourly_away()
        entries = {
            f"s{i}": {"workflow": "test.scheduled", "cron": cron, "catch_up": "none" if i % 2 else "latest"}
            for i in range(6)
        }
        self.settings = override_settings(PIKKU_SCHEDULES=entries)
        self.settings.enable()
        self.addCleanup(self.settings.disable)
        schedules.tick()
        age("s0", past - 2 * HOUR_MS)
        age("s1", past - 2 * HOUR_MS)
        schedules.tick()

    def test_changelist_shows_next_and_last_ticks(self) -> None:
        body = self.client.get(self.url).content.decode()
        assert "s0" in body and "s5" in body
        assert "(in " in body
        assert "running" in body  # s0's last tick started a run
        assert "skipped (catch_up)" in body  # s1's missed ticks were skipped
        for action in (
            "Pause selected schedules",
            "Resume selected schedules",
            "Trigger selected schedules now",
        ):
            assert action in body

    def test_changelist_query_count_is_bounded(self) -> None:
        self.client.get(self.url)
        with self.assertNumQueries(5):
            self.client.get(self.url)

    def test_change_page_lists_the_ledger(self) -> None:
        schedule = WorkflowSchedule.objects.get(name="s0")
        body = self.client.get(
            reverse("admin:pikku_django_workflowschedule_change", args=[schedule.pk])
        ).content
        assert b"The whole ledger" in body and b'name="cron"' not in body
        ledger = reverse("admin:pikku_django_workflowscheduletick_changelist")
        listed = self.client.get(ledger, {"schedule__id__exact": schedule.pk})
        assert listed.status_code == 200 and b"s0" in listed.content

    def test_actions(self) -> None:
        pks = list(WorkflowSchedule.objects.filter(name__in=["s2", "s3"]).values_list("pk", flat=True))
        post = {"_selected_action": pks}
        body = self.client.post(self.url, {**post, "action": "pause_schedules"}, follow=True).content.decode()
        assert "Paused 2 schedules." in body
        body = self.client.post(self.url, {**post, "action": "pause_schedules"}, follow=True).content.decode()
        assert "Paused 0 schedules. Skipped 2 paused already." in body
        body = self.client.post(
            self.url, {**post, "action": "resume_schedules"}, follow=True
        ).content.decode()
        assert "Resumed 2 schedules." in body
        assert not WorkflowSchedule.objects.filter(pk__in=pks, paused=True).exists()
        body = self.client.post(
            self.url, {**post, "action": "trigger_schedules"}, follow=True
        ).content.decode()
        assert "Triggered 2 schedules." in body
        assert WorkflowScheduleTick.objects.filter(schedule__in=pks, manual=True).count() == 2

    def test_read_only(self) -> None:
        assert self.client.get(reverse("admin:pikku_django_workflowschedule_add")).status_code == 403
        model_admin = WorkflowScheduleAdmin(WorkflowSchedule, site)
        plain = WorkflowSchedule.objects.get(name="s4")  # not annotated
        assert model_admin.last_tick(plain) == model_admin.get_empty_value_display()
        assert "(in " in model_admin.next_tick(plain) or "due" in model_admin.next_tick(plain)
        assert model_admin.state_display(plain) == "active"
