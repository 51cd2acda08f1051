"""Django Tasks with flow-control options, which the flow tests enqueue (tests/tasks/test_task_flow.py)."""

from __future__ import annotations

from typing import Any

from pikku_django.tasks import options
from pikku_django.tasks.compat import task

#: The calls the tasks below received, in this process (the tests drive in-process lanes).
calls: list[Any] = []


# A key per tenant through task(**kwargs), as Django 6.1 (and the django_tasks backport) pass it on.
@task(queue_name="a", key="tenant:{tenant}")  # type: ignore[call-overload,untyped-decorator]
def per_tenant(*, tenant: str, n: int) -> int:
    calls.append((tenant, n))
    return n


def _sync_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return f"sync:{args[0]}"


# A dedup key from a callable of (args, kwargs), through options().
@options(dedup_key=_sync_key)
@task()
def sync_once(tenant: str) -> str:
    calls.append(tenant)
    return tenant


@options(dedup_key="sync:{tenant}", dedup="raise")
@task()
def sync_or_raise(*, tenant: str) -> str:
    calls.append(tenant)
    return tenant


@options(key="doc:{doc}", debounce_ms=60_000, debounce_mode="collect")
@task()
def reindex(calls_seen: list[dict[str, Any]]) -> int:
    calls.append(calls_seen)
    return len(calls_seen)


@options(key="doc:{doc}", debounce_ms=60_000)
@task()
def reindex_last(*, doc: int, version: int) -> int:
    calls.append((doc, version))
    return version
