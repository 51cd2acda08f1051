"""Small helpers for the schedule tests: instants on the database clock, aged ledgers."""

from __future__ import annotations

from typing import Any

from pikku_django.models import Lease, WorkflowSchedule, WorkflowScheduleTick

HOUR_MS = 3_600_000
MINUTE_MS = 60_000


def db_now_ms() -> int:
    return Lease.objects.db_now_ms()


def hourly_away(minutes_ahead: int = 30) -> tuple[str, int]:
    """
    An hourly cron whose next tick is ``minutes_ahead`` minutes away (so no
    tick falls due while a test runs), and its newest past tick (epoch ms).
    """
    now = db_now_ms()
    minute = (now // MINUTE_MS + minutes_ahead) % 60
    past = (now // MINUTE_MS) * MINUTE_MS
    while (past // MINUTE_MS) % 60 != minute:
        past -= MINUTE_MS
    return f"{minute} * * * *", past


def age(name: str, last_tick_at: int, **fields: Any) -> WorkflowSchedule:
    """Record a cron tick of schedule ``name`` at ``last_tick_at``: its missed ticks are those after it."""
    schedule = WorkflowSchedule.objects.get(name=name)
    WorkflowScheduleTick.objects.create(schedule=schedule, tick_at=last_tick_at, **fields)
    return schedule


def ledger(name: str) -> list[tuple[int, str, bool]]:
    """(tick_at, skipped, manual) of every recorded tick of ``name``, oldest first."""
    return list(
        WorkflowScheduleTick.objects.filter(schedule__name=name)
        .order_by("tick_at")
        .values_list("tick_at", "skipped", "manual")
    )


def daily_away(minutes_ahead: int = 30) -> tuple[str, int]:
    """
    A daily cron (UTC) whose next tick is ``minutes_ahead`` minutes away, and
    its newest past tick (epoch ms): a day before that next tick.
    """
    now = db_now_ms()
    at = (now // MINUTE_MS + minutes_ahead) * MINUTE_MS
    minute, hour = (at // MINUTE_MS) % 60, (at // HOUR_MS) % 24
    return f"{minute} {hour} * * *", at - 24 * HOUR_MS
