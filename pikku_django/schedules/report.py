"""What the command and the admin show of a schedule: its state, next ticks and last tick, on the DB clock."""

from __future__ import annotations

import datetime
from typing import Any

from pikku_django.models import WorkflowSchedule
from pikku_django.schedules import cron

UTC = datetime.timezone.utc


def iso(ms: int | None) -> str | None:
    """Epoch ms as an ISO 8601 UTC instant, or None."""
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def state(schedule: WorkflowSchedule) -> str:
    if not schedule.enabled:
        return "disabled"
    return "paused" if schedule.paused else "active"


def next_ticks(schedule: WorkflowSchedule, count: int) -> list[int]:
    """
    The schedule's next ``count`` ticks not yet recorded (epoch ms), the first
    of which may be overdue when no scheduler runs; none for a schedule that
    is paused or disabled. Needs ``with_last_tick()``.
    """
    if schedule.paused or not schedule.enabled:
        return []
    found: list[int] = []
    after = schedule.ticks_after(getattr(schedule, "last_tick_at", None))
    for _ in range(count):
        after = cron.next_after_ms(schedule.cron, schedule.timezone, after)
        found.append(after)
    return found


def describe(schedule: WorkflowSchedule, count: int = 3) -> dict[str, Any]:
    """A schedule as JSON (needs ``with_latest()``): what ``pikku_schedules --json`` prints for it."""
    now = int(getattr(schedule, "db_now_ms"))  # noqa: B009  (an annotation)
    latest = getattr(schedule, "latest_tick_at", None)
    return {
        "name": schedule.name,
        "target": schedule.target,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "state": state(schedule),
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "db_now": iso(now),
        "next_ticks": [iso(at) for at in next_ticks(schedule, count)],
        "last_tick": None
        if latest is None
        else {
            "at": iso(latest),
            "manual": bool(getattr(schedule, "latest_manual", False)),
            "skipped": getattr(schedule, "latest_skipped", "") or "",
            "run": None if getattr(schedule, "latest_run_id", None) is None else str(schedule.latest_run_id),  # type: ignore[attr-defined]
            "run_status": getattr(schedule, "latest_run_status", None),
            "task_result_id": getattr(schedule, "latest_task_result_id", "") or None,
        },
    }
