"""A schedule by hand: trigger a tick now, pause, resume; and which tick started a run."""

from __future__ import annotations

import datetime

from django.db import router

from pikku_django.clock import DbNow, DbNowMs
from pikku_django.errors import ScheduleNotFoundError
from pikku_django.models import WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from pikku_django.schedules.ledger import _alias, _insert, _start
from pikku_django.sql.conflicts import in_transaction


def _get(name: str, alias: str) -> WorkflowSchedule:
    try:
        return WorkflowSchedule.objects.db_manager(alias).get(name=name)
    except WorkflowSchedule.DoesNotExist:
        raise ScheduleNotFoundError(name) from None


def manual_instant(now: int, taken: set[int]) -> int:
    """
    The instant of a manual tick at ``now`` (epoch ms): the first not taken
    that is not a whole second. A cron's instants are whole seconds (whole
    minutes, or a DST change's end), so a manual tick never takes one, and a
    pass always records the cron's tick it falls on.
    """
    at = now
    while at in taken or at % 1000 == 0:
        at += 1
    return at


def trigger(name: str, *, using: str | None = None) -> WorkflowScheduleTick:
    """Record a manual tick of the schedule ``name`` at the database clock's now, and start its run."""
    alias = _alias(using)
    schedule = _get(name, alias)
    if not schedule.enabled:
        raise ScheduleNotFoundError(name, "it is disabled (no longer in PIKKU_SCHEDULES)")
    schedules = WorkflowSchedule.objects.db_manager(alias)

    def write() -> WorkflowScheduleTick:
        schedules.get_queryset().hold(schedule.pk, wait=True)
        now = schedules.annotate(now=DbNowMs()).values_list("now", flat=True).get(pk=schedule.pk)
        taken = set(
            WorkflowScheduleTick.objects.db_manager(alias)
            .filter(schedule=schedule, tick_at__gte=now)
            .values_list("tick_at", flat=True)
        )
        row = WorkflowScheduleTick(
            schedule=schedule, tick_at=manual_instant(now, taken), manual=True, created_at=DbNow()
        )
        _start(alias, schedule, row)
        return _insert(alias, [row])[0]

    return in_transaction(alias, write)


def pause(name: str, *, using: str | None = None) -> bool:
    """Pause the schedule ``name``; False if it was paused already."""
    alias = _alias(using)
    return (
        WorkflowSchedule.objects.db_manager(alias).get_queryset().filter(pk=_get(name, alias).pk).pause() == 1
    )


def resume(name: str, *, using: str | None = None) -> bool:
    """Resume the schedule ``name`` (the ticks it missed never run); False if it was not paused."""
    alias = _alias(using)
    return (
        WorkflowSchedule.objects.db_manager(alias).get_queryset().filter(pk=_get(name, alias).pk).resume()
        == 1
    )


def scheduled_at(run: WorkflowRun, *, using: str | None = None) -> datetime.datetime | None:
    """The instant of the tick that started ``run`` (aware UTC), or None if no schedule did."""
    alias = using or run._state.db or router.db_for_read(WorkflowScheduleTick)
    return WorkflowScheduleTick.objects.db_manager(alias).scheduled_at(run.pk)
