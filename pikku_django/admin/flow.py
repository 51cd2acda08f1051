"""
Why a run waits for flow control (docs/flow-control.md), for the run's page:
"debounced until …", "rate-limited until …", "key slots 2/2".
"""

from __future__ import annotations

import datetime

from pikku_django.admin.base import format_ms
from pikku_django.clock import DbNowMs
from pikku_django.conf import conf
from pikku_django.models import Lease, WorkflowRun
from pikku_django.queues import key_slot_keys


def describe_flow(run: WorkflowRun, now_ms: int) -> str:
    """What flow control says of ``run`` now, on the database clock; "" when nothing."""
    parts: list[str] = []
    ahead = run.status == "running" and run.wake_at is not None and run.wake_at > now_ms
    leases = Lease.objects.using(run._state.db)
    if ahead and run.debounce_until is not None and not leases.filter(key=run.lease_key).exists():
        parts.append(f"debounced until {_instant(run.wake_at, now_ms)}")
    elif ahead and run.rate_at is None and conf.rate(run.queue) is not None:
        parts.append(f"rate-limited until {_instant(run.wake_at, now_ms)}")
    per_key = conf.per_key_concurrency(run.queue)
    if run.key is not None and per_key is not None:
        slots = leases.filter(key__in=key_slot_keys(run.queue, run.key, per_key), expires_at__gt=DbNowMs())
        held = slots.count()
        parts.append(f"key slots {held}/{per_key}")
    return "; ".join(parts)


def _instant(ms: int | None, now_ms: int) -> str:
    """An instant in epoch ms as UTC, and how far ahead it is."""
    assert ms is not None
    at = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return f"{at:%Y-%m-%d %H:%M:%S} UTC (in {format_ms(max(0, ms - now_ms))})"
