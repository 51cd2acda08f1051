"""
The cadence of a worker's loops beside its lanes: the scheduler reads when a
tick falls due (and every few seconds besides), the sweep prunes once a minute.
"""

from __future__ import annotations

from unittest import mock

from django.test import TestCase, override_settings

from pikku_django import schedules, wakeups
from pikku_django.models import WorkflowSchedule
from pikku_django.schedules import tick_until_next
from pikku_django.sweep import SweepReport
from pikku_django.worker import Worker
from pikku_django.worker.loops import (
    SCHEDULE_REREAD_S,
    SWEEP_PRUNE_S,
    TICK_MARGIN_S,
    SchedulerLoop,
    SweepLoop,
)
from tests.support.schedules import HOUR_MS, age, db_now_ms, hourly_away, ledger


def every(cron: str) -> dict[str, object]:
    return {"report": {"workflow": "test.scheduled", "cron": cron}}


def scheduler() -> SchedulerLoop:
    return SchedulerLoop(Worker(holder="scheduler", schedules=True))


class SchedulerCadenceTests(TestCase):
    def test_no_schedule_is_read_again_every_few_seconds(self) -> None:
        loop = scheduler()
        with override_settings(PIKKU_SCHEDULES={}):
            loop.poll()
        assert loop.next_in is None
        assert loop.idle_wait() == SCHEDULE_REREAD_S

    def test_a_tick_far_away_is_read_for_every_few_seconds(self) -> None:
        cron, _ = hourly_away(30)
        loop = scheduler()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick_until_next()
            before = db_now_ms()
            loop.poll()
            after = db_now_ms()
        schedule = WorkflowSchedule.objects.with_last_tick().get(name="report")
        next_at = schedules.next_tick_at(schedule)
        assert loop.next_in is not None
        assert (next_at - after) / 1000 <= loop.next_in <= (next_at - before) / 1000
        assert loop.idle_wait() == SCHEDULE_REREAD_S

    def test_a_tick_due_soon_is_waited_for_exactly(self) -> None:
        loop = scheduler()
        loop.next_in = 1.25
        assert loop.idle_wait() == 1.25 + TICK_MARGIN_S

    def test_a_due_tick_runs_and_the_next_pass_follows_within_a_second(self) -> None:
        cron, past = hourly_away()
        loop = scheduler()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick_until_next()
            age("report", past - HOUR_MS)
            recorded, next_in = tick_until_next()
            assert [row.tick_at for row in recorded] == [past]
            assert next_in == 0
            loop.next_in = next_in
            assert loop.idle_wait() == 1.0
            # The pass after it reads the row anew: the next tick is the cron's.
            assert tick_until_next()[0] == []

    def test_a_paused_schedule_is_not_waited_for_and_is_honoured(self) -> None:
        cron, past = hourly_away()
        loop = scheduler()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick_until_next()
            schedules.pause("report")
            age("report", past - HOUR_MS)
            loop.poll()
            assert loop.next_in is None
            assert len(ledger("report")) == 1
            schedules.resume("report")
            loop.poll()
            assert loop.next_in is not None and loop.next_in > 0

    def test_a_trigger_wakes_the_lanes_itself(self) -> None:
        cron, _ = hourly_away()
        with override_settings(PIKKU_SCHEDULES=every(cron)):
            tick_until_next()
            before = wakeups.nudges()
            with self.captureOnCommitCallbacks(execute=True):
                row = schedules.trigger("report")
        assert row.run is not None and row.manual
        assert wakeups.nudges() > before


class SweepCadenceTests(TestCase):
    def test_the_first_pass_prunes_then_one_a_minute(self) -> None:
        loop = SweepLoop(Worker(holder="sweeper", sweep_interval=5))
        with mock.patch("pikku_django.worker.loops.sweep", return_value=SweepReport(dry_run=False)) as sweep:
            loop.poll()
            loop.poll()
            loop.pruned_at -= SWEEP_PRUNE_S
            loop.poll()
        assert [call.kwargs["prune"] for call in sweep.call_args_list] == [True, False, True]

    def test_a_pass_without_prunes_prunes_nothing(self) -> None:
        from pikku_django.sweep import sweep

        with (
            mock.patch("pikku_django.sweep.prune_runs") as prune_runs,
            mock.patch("pikku_django.sweep._prune_leases") as prune_leases,
        ):
            report = sweep(prune=False)
        prune_runs.assert_not_called()
        prune_leases.assert_not_called()
        assert (report.pruned_leases, report.pruned_runs) == (0, 0)
