"""
Schedules (cron), exactly once per tick: ``config`` reads and checks
``PIKKU_SCHEDULES``, ``cron`` parses expressions and finds their instants,
``ledger`` syncs the setting and records due ticks (``tick()``), ``operate``
triggers, pauses and resumes by hand, ``report`` describes a schedule.
"""

from __future__ import annotations

from pikku_django.schedules.ledger import (
    HORIZON_MS,
    LATE_MS,
    MAX_TICKS_PER_PASS,
    idempotency_key,
    next_tick_at,
    sync,
    tick,
    tick_until_next,
    ticks,
)
from pikku_django.schedules.operate import pause, resume, scheduled_at, trigger

__all__ = [
    "HORIZON_MS",
    "LATE_MS",
    "MAX_TICKS_PER_PASS",
    "idempotency_key",
    "next_tick_at",
    "pause",
    "resume",
    "scheduled_at",
    "sync",
    "tick",
    "tick_until_next",
    "ticks",
    "trigger",
]
