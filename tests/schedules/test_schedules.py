"""tick(): syncing PIKKU_SCHEDULES, due ticks, catch-up and overlap, pause, resume, trigger."""

from __future__ import annotations

import datetime
from unittest import skipUnless

import pytest
from django.db import connection
from django.db.models import F
from django.test import TestCase, override_settings

from pikku_django import schedules
from pikku_django.errors import InvalidArgumentError, ScheduleNotFoundError
from pikku_django.models import WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from pikku_django.schedules import tick
from pikku_django.sweep import sweep
from pikku_django.workflows import run_workflow
from tests.support.schedules import HOUR_MS, MINUTE_MS, age, db_now_ms, hourly_away, ledger


def every(cron: str, **options: object) -> dict[str, object]:
    return {"report": {"workflow": "test.scheduled", "cron": cron, "input": {"kind": "daily"}, **options}}


class SyncTests(TestCase):
    def test_first_pass_syncs_and_records_nothing(self) -> None:
        cron, _ = hourly_away()
        with override_settings(
            PIKKU_SCHEDULES=every(cron, timezone="Europe/Helsinki", queue="a", priority=3)
        ):
            before = db_now_ms()
            assert tick() == []
        schedule = WorkflowSchedule.objects.get(name="report")
        assert (schedule.workflow, schedule.cron, schedule.timezone) == (
            "test.scheduled",
            cron,
            "Europe/Helsinki",
        )
        assert (schedule.queue, schedule.priority, schedule.input) == ("a", 3, {"kind": "daily"})
        assert schedule.enabled and not schedule.paused
        # The first tick is the first after the sync.
        assert before <= schedule.start_after <= db_now_ms()
        assert not WorkflowScheduleTick.objects.exists() and not WorkflowRun.objects.exists()

    def test_removed_entry_is_disabled_and_keeps_its_ledger(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past - HOUR_MS)
            assert len(tick()) == 1
        with override_settings(PIKKU_SCHEDULES={}):
            assert tick() == []
        schedule = WorkflowSchedule.objects.get(name="report")
        assert not schedule.enabled
        assert len(ledger("report")) == 2
        with pytest.raises(ScheduleNotFoundError, match="report"):
            schedules.trigger("report")

    def test_changed_cron_starts_afresh(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past - 3 * HOUR_MS)
        other, _ = hourly_away(40)
        with override_settings(PIKKU_SCHEDULES=every(other)):
            assert tick() == []
        schedule = WorkflowSchedule.objects.get(name="report")
        assert schedule.cron == other and schedule.resumed_at is not None and schedule.resumed_at > past

    def test_a_bad_entry_is_left_alone_and_the_others_tick(self) -> None:
        cron, past = hourly_away()
        good = every(cron)
        with override_settings(PIKKU_SCHEDULES=good):
            tick()
            age("report", past - HOUR_MS)
        with override_settings(PIKKU_SCHEDULES={**good, "bad": {"workflow": "nope", "cron": "* * *"}}):
            recorded = tick()
        assert [row.schedule.name for row in recorded] == ["report"]
        assert not WorkflowSchedule.objects.filter(name="bad").exists()


class IdlePassTests(TestCase):
    def test_an_idle_pass_is_one_select_whatever_the_number_of_schedules(self) -> None:
        cron, _ = hourly_away()
        entries = {f"s{i}": {"workflow": "test.scheduled", "cron": cron} for i in range(20)}
        with override_settings(PIKKU_SCHEDULES=entries):
            tick()
            with self.assertNumQueries(1):
                assert tick() == []
        with override_settings(PIKKU_SCHEDULES={}):
            # A sync: the read, the setting's first-seen time (read, recorded
            # in a savepoint, read again), one UPDATE that disables the twenty,
            # the read again.
            with self.assertNumQueries(8 if connection.features.uses_savepoints else 6):
                tick()
            with self.assertNumQueries(1):
                tick()

    @skipUnless(connection.vendor == "postgresql", "EXPLAIN output is PostgreSQL's")
    def test_the_idle_read_probes_the_ledger_by_its_unique_index(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past)
            captured: list[tuple[str, object]] = []

            def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
                captured.append((text, params))
                return execute(text, params, many, context)

            with connection.execute_wrapper(capture):
                tick()
        ((text, params),) = captured
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + text, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "pikku_tick_schedule_at_uniq" in plan, plan
        assert "Seq Scan on pikku_schedule_tick" not in plan, plan


class DueTests(TestCase):
    def test_a_due_tick_starts_its_run_once(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, queue="a", priority=5)):
            tick()
            age("report", past - HOUR_MS)
            (row,) = tick()
            assert tick() == []
        assert (row.tick_at, row.skipped, row.manual) == (past, "", False)
        run = row.run
        assert run is not None
        assert run.idempotency_key == f"schedule:report:{past}"
        assert (run.workflow, run.input, run.queue, run.priority) == (
            "test.scheduled",
            {"kind": "daily"},
            "a",
            5,
        )
        assert row.scheduled_at == datetime.datetime.fromtimestamp(past / 1000, tz=datetime.timezone.utc)

    def test_a_workflow_sees_scheduled_at(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past - HOUR_MS)
            (row,) = tick()
        run_workflow(row.run_id)
        run = WorkflowRun.objects.get(pk=row.run_id)
        assert run.status == "completed", run.error
        expected = datetime.datetime.fromtimestamp(past / 1000, tz=datetime.timezone.utc)
        assert run.output == {"scheduled_at": expected.isoformat(), "input": {"kind": "daily"}}
        plain = WorkflowRun.objects.create_run("test.scheduled")
        run_workflow(plain.pk)
        plain.refresh_from_db()
        assert plain.output["scheduled_at"] is None

    def test_the_sweep_pruning_a_ticks_run_never_runs_the_tick_again(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron), PIKKU_RETENTION_MS={"completed": 1}):
            tick()
            age("report", past - HOUR_MS)
            (row,) = tick()
            run_workflow(row.run_id)
            WorkflowRun.objects.filter(pk=row.run_id).update(
                updated_at=F("updated_at") - datetime.timedelta(hours=1)
            )
            assert sweep().pruned_runs == 1
            assert not WorkflowRun.objects.filter(pk=row.run_id).exists()
            # The ledger row stays (its run gone), and the tick is never due again.
            assert tick() == []
        row.refresh_from_db()
        assert (row.run_id, row.skipped) == (None, "")
        assert not WorkflowRun.objects.filter(idempotency_key=f"schedule:report:{past}").exists()

    def test_a_tick_seen_within_a_minute_simply_runs(self) -> None:
        now = db_now_ms()
        minute = now // MINUTE_MS * MINUTE_MS
        with override_settings(PIKKU_SCHEDULES=every("* * * * *", catch_up="none")):
            tick()
            age("report", minute - 3 * MINUTE_MS)
            recorded = tick()
        by_tick = {row.tick_at: row.skipped for row in recorded}
        # Two and one minute back are missed ticks (none: skipped); this
        # minute's is at most a minute late and runs. (A minute that turned
        # meanwhile adds a tick that runs too.)
        assert by_tick[minute - 2 * MINUTE_MS] == "catch_up"
        assert by_tick[minute] == ""
        assert all(skipped == "" for at, skipped in by_tick.items() if at > minute)

    def test_a_schedule_that_cannot_start_is_left_alone_for_a_while(self) -> None:
        cron, past = hourly_away()
        setting = {
            "adder": {"task": "testproject.testing.tasks.add", "cron": cron, "input": {"a": 1, "b": 2}}
        }
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
            age("adder", past - HOUR_MS)
            # The stored path no longer names a task (a deploy removed it, say).
            WorkflowSchedule.objects.filter(name="adder").update(task="testproject.testing.tasks.gone")
            with self.assertLogs("pikku_django.schedules.ledger", "ERROR") as logs:
                assert tick() == []
            assert "Schedule 'adder'" in logs.output[0] and "tries again in 30 s" in logs.output[0]
            with self.assertNumQueries(1):
                assert tick() == []
        assert len(ledger("adder")) == 1

    def test_pruned_runs_do_not_run_again(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            age("report", past - HOUR_MS)
            (row,) = tick()
            WorkflowRun.objects.filter(pk=row.run_id).delete()
            # Even with every older ledger row gone, only the newest counts.
            WorkflowScheduleTick.objects.exclude(pk=row.pk).delete()
            assert tick() == []
        row.refresh_from_db()
        assert row.run_id is None
        assert not WorkflowRun.objects.exists()


class CatchUpTests(TestCase):
    def _missed(self, **options: object) -> list[tuple[int, str, bool]]:
        """Five hourly ticks missed: the last recorded one is five hours before the newest."""
        cron, past = hourly_away()
        self.past = past
        with override_settings(PIKKU_SCHEDULES=every(cron, **options)):
            tick()
            age("report", past - 5 * HOUR_MS)
            recorded = tick()
            assert tick() == []
        assert [row.tick_at for row in recorded] == [past - n * HOUR_MS for n in (4, 3, 2, 1, 0)]
        return [(row.tick_at, row.skipped, row.run_id is not None) for row in recorded]

    def test_latest_runs_the_newest_missed_tick(self) -> None:
        got = self._missed()
        assert [(skipped, started) for _, skipped, started in got] == [("catch_up", False)] * 4 + [("", True)]

    def test_all_runs_each_within_the_window_oldest_first(self) -> None:
        got = self._missed(catch_up="all", catch_up_window_ms=3 * HOUR_MS)
        # 4.5 h, 3.5 h, 2.5 h, 1.5 h and 0.5 h late: the last three are within 3 h.
        assert [skipped for _, skipped, _ in got] == ["catch_up", "catch_up", "", "", ""]
        runs = WorkflowRun.objects.order_by("created_at", "idempotency_key")
        assert [run.idempotency_key for run in runs] == [
            f"schedule:report:{self.past - n * HOUR_MS}" for n in (2, 1, 0)
        ]

    def test_none_skips_every_missed_tick(self) -> None:
        got = self._missed(catch_up="none")
        assert {skipped for _, skipped, _ in got} == {"catch_up"}
        assert not WorkflowRun.objects.exists()

    def test_a_long_downtime_records_its_newest_ticks_in_one_bounded_pass(self) -> None:
        now = db_now_ms()
        with override_settings(PIKKU_SCHEDULES=every("* * * * *", catch_up="none")):
            tick()
            age("report", now // MINUTE_MS * MINUTE_MS - 20 * HOUR_MS)
            first = tick()
            assert len(first) == schedules.MAX_TICKS_PER_PASS
            second = tick()
        assert len(second) <= 1 and all(row.tick_at > first[-1].tick_at for row in second)
        # The missed ticks are skipped (none); this minute's is on time and runs.
        assert {row.skipped for row in first[:-1]} == {"catch_up"}
        assert first[-1].tick_at >= now // MINUTE_MS * MINUTE_MS - MINUTE_MS


class OverlapTests(TestCase):
    def test_skip_while_a_run_is_unfinished(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, catch_up="all", overlap="skip")):
            tick()
            age("report", past - 3 * HOUR_MS)
            recorded = tick()
        assert [row.skipped for row in recorded] == ["", "overlap", "overlap"]
        first = recorded[0].run
        assert first is not None and WorkflowRun.objects.count() == 1

    def test_skip_after_the_run_finished_starts_again(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, overlap="skip")):
            tick()
            first = schedules.trigger("report")
            run_workflow(first.run_id)
            age("report", past - HOUR_MS)
            (row,) = tick()
        assert row.skipped == "" and row.run_id is not None

    def test_allow_starts_every_tick(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron, catch_up="all")):
            tick()
            age("report", past - 3 * HOUR_MS)
            recorded = tick()
        assert [row.skipped for row in recorded] == ["", "", ""]
        assert WorkflowRun.objects.count() == 3


class ByHandTests(TestCase):
    def test_paused_records_nothing_and_resume_skips_what_it_missed(self) -> None:
        cron, past = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            assert schedules.pause("report") is True
            assert schedules.pause("report") is False
            age("report", past - 2 * HOUR_MS)
            assert tick() == []
            assert schedules.resume("report") is True
            assert schedules.resume("report") is False
            assert tick() == []
        assert len(ledger("report")) == 1
        schedule = WorkflowSchedule.objects.with_last_tick().get(name="report")
        assert schedules.next_tick_at(schedule) == past + HOUR_MS

    def test_trigger_records_a_manual_tick_at_db_now(self) -> None:
        cron, _ = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick()
            before = db_now_ms()
            row = schedules.trigger("report")
            again = schedules.trigger("report")
            assert tick() == []
        assert row.manual and row.skipped == "" and before <= row.tick_at <= db_now_ms()
        assert again.tick_at > row.tick_at
        assert row.run is not None and row.run.idempotency_key == f"schedule:report:{row.tick_at}"
        # A manual tick is not the cron's: the next cron tick still runs.
        schedule = WorkflowSchedule.objects.with_last_tick().get(name="report")
        assert schedules.next_tick_at(schedule) > db_now_ms()

    def test_unknown_names_are_refused(self) -> None:
        for call in (schedules.trigger, schedules.pause, schedules.resume):
            with pytest.raises(ScheduleNotFoundError, match="'nope'") as raised:
                call("nope")
            assert isinstance(raised.value, InvalidArgumentError)
