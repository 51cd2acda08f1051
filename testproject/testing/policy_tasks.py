"""Django Tasks with policy options, which the policy tests enqueue (tests/tasks/test_task_policies.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pikku_django.errors import NonRetryableError, TaskTimeoutError
from pikku_django.policy import exponential, fixed
from pikku_django.tasks import options
from pikku_django.tasks.compat import task

#: Calls by key, in this process (the tests drive in-process lanes).
calls: dict[str, int] = {}


class Transient(Exception):
    """An error the policy tasks retry."""


class Permanent(Exception):
    """An error outside their ``retry_on``."""


def _fail(key: str, failures: int, kind: str) -> str:
    calls[key] = calls.get(key, 0) + 1
    if calls[key] <= failures:
        error: type[Exception] = {"transient": Transient, "permanent": Permanent, "final": NonRetryableError}[
            kind
        ]
        raise error(f"{key} failure {calls[key]}")
    return f"{key} ok after {calls[key]}"


# Options through task(**kwargs), as Django 6.1 (and the django_tasks backport) pass them on.
@task(max_attempts=3, backoff=fixed(300), retry_on=(Transient,))  # type: ignore[call-overload,untyped-decorator]
def through_task(key: str, failures: int, kind: str = "transient") -> str:
    return _fail(key, failures, kind)


# The same through options(), on every Django version.
@options(max_attempts=4, backoff=exponential(first_ms=200, factor=2))
@task()
def through_options(key: str, failures: int, kind: str = "transient") -> str:
    return _fail(key, failures, kind)


@options(max_attempts=2, backoff=fixed(60_000))
@task()
def long_backoff(key: str) -> Any:
    return _fail(key, 9, "transient")


@options(max_attempts=1, timeout_ms=1_000)
@task()
def slow_task() -> str:
    """Runs 5 s in small sleeps, unless its timeout stops it."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        time.sleep(0.01)
    return "late"


@options(max_attempts=1, timeout_ms=1_000)
@task()
async def slow_async_task() -> str:
    """Awaits 5 s, unless its timeout cancels it."""
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        calls["cancelled"] = calls.get("cancelled", 0) + 1
        raise
    return "late"


@options(max_attempts=1, timeout_ms=1_000)
@task()
def ignoring_task() -> str:
    """Runs 2.5 s, ignoring its timeout."""
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except TaskTimeoutError:
            calls["ignored"] = calls.get("ignored", 0) + 1
    return "late"
