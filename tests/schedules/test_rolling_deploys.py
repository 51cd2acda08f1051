"""
Rolling deploys: a process on an older PIKKU_SCHEDULES that starts after
the new workers synced theirs never writes it back, and no worker ticks a
schedule the newest synced setting does not name.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TestCase, override_settings

from pikku_django.models import WorkflowSchedule, WorkflowScheduleSetting
from pikku_django.schedules import ledger, syncing, tick
from tests.schedules.test_schedule_processes import TickerTestCase
from tests.support.children import send_line
from tests.support.schedules import HOUR_MS, age, hourly_away

OLD_MINUTE, NEW_MINUTE = 30, 40


def setting(*names: str, minutes_ahead: int = OLD_MINUTE) -> dict[str, Any]:
    cron, _ = hourly_away(minutes_ahead)
    return {name: {"workflow": "test.scheduled", "cron": cron} for name in names}


def restart() -> None:
    """What a process that starts afresh knows: nothing synced yet."""
    syncing._synced.clear()
    ledger._failing.clear()


class OlderSettingTests(TestCase):
    def test_an_old_process_starting_after_the_new_ones_revives_nothing(self) -> None:
        old = setting("kept", "removed")
        new = {**setting("kept", minutes_ahead=NEW_MINUTE), "added": old["removed"]}
        with override_settings(PIKKU_SCHEDULES=old):
            tick()
        with override_settings(PIKKU_SCHEDULES=new):
            tick()
        # An old pod restarted mid-rollout: the old setting, a fresh process.
        with override_settings(PIKKU_SCHEDULES=old):
            restart()
            _, past = hourly_away(OLD_MINUTE)
            age("removed", past - HOUR_MS)
            assert tick() == []
        rows = {row.name: (row.enabled, row.cron) for row in WorkflowSchedule.objects.all()}
        assert rows == {
            "kept": (True, new["kept"]["cron"]),
            "removed": (False, old["removed"]["cron"]),
            "added": (True, old["removed"]["cron"]),
        }

    def test_a_worker_ticks_only_what_the_newest_setting_names(self) -> None:
        old = setting("kept", "removed")
        with override_settings(PIKKU_SCHEDULES=old):
            tick()
        with override_settings(PIKKU_SCHEDULES=setting("kept")):
            tick()
        # A row the newest setting does not name, enabled behind its back
        # by an old process that synced as the new one did: no worker ticks it.
        first = WorkflowScheduleSetting.objects.order_by("first_seen_at").first()
        assert first is not None
        WorkflowSchedule.objects.filter(name="removed").update(
            enabled=True, setting_seen_at=first.first_seen_at
        )
        _, past = hourly_away(OLD_MINUTE)
        age("removed", past - HOUR_MS)
        age("kept", past - HOUR_MS)
        with override_settings(PIKKU_SCHEDULES=old):
            restart()
            recorded = tick()
        assert [row.schedule.name for row in recorded] == ["kept"]


@pytest.mark.slow
class OlderSettingProcessTests(TickerTestCase):
    def test_an_old_setting_process_after_new_workers_leaves_the_new_setting(self) -> None:
        old = setting("kept", "removed")
        new = setting("kept", minutes_ahead=NEW_MINUTE)
        for value in (old, new, old):
            (proc,) = self.tickers(1, 1, value)
            send_line(proc, "go")
            assert self.results([proc]) == []
        rows = {row.name: (row.enabled, row.cron) for row in WorkflowSchedule.objects.all()}
        assert rows == {"kept": (True, new["kept"]["cron"]), "removed": (False, old["removed"]["cron"])}
