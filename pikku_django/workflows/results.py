"""
Reading what a run tells the world, from a view or any other code:
``wait_for_result`` (the finished run), ``get_event`` (an event's last
value), ``read_stream`` (a stream's items in order), and their async twins
``await_result``, ``aget_event``, ``aread_stream``. Each only reads, waits on
the database clock (``waiting``), and changes nothing about the run when it
times out or is cancelled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.errors import InvalidArgumentError, ResultTimeoutError
from pikku_django.managers import FINISHED_RUN_STATUSES
from pikku_django.managers.base import write_alias
from pikku_django.models import WorkflowEvent, WorkflowRun, WorkflowStreamItem
from pikku_django.workflows.waiting import Deadline, apause, listening, pause

#: How long ``wait_for_result`` waits when no ``timeout_ms`` is given.
DEFAULT_RESULT_TIMEOUT_MS = 30_000

#: How long ``read_stream`` waits for each next item when no ``timeout_ms`` is given.
DEFAULT_STREAM_TIMEOUT_MS = 30_000

#: How many items of a stream one look reads.
STREAM_BATCH = 100


def _timeout(timeout_ms: object) -> int:
    return validate.whole("timeout_ms", timeout_ms, maximum=validate.MAX_TTL_MS)


def run_state(alias: str, run_id: Any, *, missing_ok: bool = False) -> tuple[str | None, int]:
    """
    The run's status and the database clock's now, in one read. An unknown
    (or pruned) run is an ``InvalidArgumentError`` naming ``run_id``, or a
    None status with ``missing_ok``.
    """
    try:
        row = (
            WorkflowRun.objects.using(alias)
            .filter(pk=run_id)
            .annotate(now=DbNowMs())
            .values_list("status", "now")
            .first()
        )
    except (ValidationError, ValueError, TypeError):
        row = None
    if row is not None:
        return str(row[0]), int(row[1])
    if missing_ok:
        return None, 0
    raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.")


#: What a look finds: whether the wait is over, the value then, and the database clock's now (ms).
Found = tuple[bool, Any, int]


def wait_until_found(
    alias: str, run_id: Any, look: Callable[[], Found], timeout_ms: int, *, listen: bool
) -> Any:
    """
    ``look()`` until it finds (its value), or None once ``timeout_ms`` has
    passed on the database clock; pauses cut short by the run's commits
    where ``listen`` and the database carries them.
    """
    ear = listening(alias, run_id) if listen else None
    try:
        deadline = Deadline(timeout_ms)
        while True:
            found, value, now = look()
            if found:
                return value
            ms = deadline.pause_ms(now, heard=ear is not None and ear.live)
            if ms is None:
                return None
            pause(ms, ear)
    finally:
        if ear is not None:
            ear.close()


async def await_until_found(
    alias: str, run_id: Any, look: Callable[[], Found], timeout_ms: int, *, listen: bool
) -> Any:
    """``wait_until_found`` for a coroutine: each look in the sync thread, the pauses on the event loop."""
    ear = await sync_to_async(listening, thread_sensitive=False)(alias, run_id) if listen else None
    try:
        deadline = Deadline(timeout_ms)
        while True:
            found, value, now = await sync_to_async(look)()
            if found:
                return value
            ms = deadline.pause_ms(now, heard=ear is not None and ear.live)
            if ms is None:
                return None
            await apause(ms, ear)
    finally:
        if ear is not None:
            ear.close()


def _finished_run(alias: str, run_id: Any) -> Found:
    """(found, run, now): found once the run has finished."""
    status, now = run_state(alias, run_id)
    if status in FINISHED_RUN_STATUSES:
        return True, WorkflowRun.objects.using(alias).get(pk=run_id), now
    return False, None, now


def _event(alias: str, run_id: Any, key: str) -> Found:
    """(found, value, now): found once the key is set, or once the run has finished without it."""
    # The status first: a run finished then has set every event it ever will.
    status, now = run_state(alias, run_id)
    events = WorkflowEvent.objects.using(alias).filter(run_id=run_id, key=key)
    rows = list(events.values_list("value", flat=True)[:1])
    if rows:
        return True, rows[0], now
    return status in FINISHED_RUN_STATUSES, None, now


class StreamReader:
    """Where a reader of one stream of a run is: ``next`` is the offset it reads next."""

    def __init__(self, alias: str, run_id: Any, stream: str, offset: int) -> None:
        self.alias, self.run_id, self.stream, self.next = alias, run_id, stream, offset

    def look(self) -> tuple[str | None, int, list[tuple[int, Any]]]:
        """The run's status (None once pruned), now, and the next items in a row from ``next``."""
        # The status first: a run finished then has published every item it ever will.
        status, now = run_state(self.alias, self.run_id, missing_ok=True)
        rows = (
            WorkflowStreamItem.objects.using(self.alias)
            .filter(run_id=self.run_id, stream=self.stream, offset__gte=self.next)
            .order_by("offset")
            .values_list("offset", "item")[:STREAM_BATCH]
        )
        batch: list[tuple[int, Any]] = []
        for offset, item in rows:
            if offset != self.next + len(batch):
                # Never past a gap: an offset is visible only after the one before it.
                break
            batch.append((int(offset), item))
        return status, now, batch

    def ended(self, status: str | None) -> bool:
        return status is None or status in FINISHED_RUN_STATUSES


def wait_for_result(
    run_id: Any, timeout_ms: int = DEFAULT_RESULT_TIMEOUT_MS, *, using: str | None = None
) -> WorkflowRun:
    """
    The run once it has finished (completed, failed or cancelled), or
    ``ResultTimeoutError`` once ``timeout_ms`` has passed on the database clock.
    """
    timeout_ms = _timeout(timeout_ms)
    alias = write_alias(WorkflowRun, using)
    run = wait_until_found(alias, run_id, partial(_finished_run, alias, run_id), timeout_ms, listen=True)
    if run is None:
        raise ResultTimeoutError(run_id, timeout_ms)
    return run  # type: ignore[no-any-return]


async def await_result(
    run_id: Any, timeout_ms: int = DEFAULT_RESULT_TIMEOUT_MS, *, using: str | None = None
) -> WorkflowRun:
    """``wait_for_result`` for a coroutine: the event loop runs on while it waits."""
    timeout_ms = _timeout(timeout_ms)
    alias = write_alias(WorkflowRun, using)
    look = partial(_finished_run, alias, run_id)
    run = await await_until_found(alias, run_id, look, timeout_ms, listen=True)
    if run is None:
        raise ResultTimeoutError(run_id, timeout_ms)
    return run  # type: ignore[no-any-return]


def get_event(run_id: Any, key: str, timeout_ms: int = 0, *, using: str | None = None) -> Any:
    """
    The last value the run set for ``key``, waiting up to ``timeout_ms`` (on
    the database clock) for a first one; None if none was set by then, or
    the run finished without setting it.
    """
    validate.name("key", key)
    timeout_ms = _timeout(timeout_ms)
    alias = write_alias(WorkflowRun, using)
    look = partial(_event, alias, run_id, key)
    return wait_until_found(alias, run_id, look, timeout_ms, listen=timeout_ms > 0)


async def aget_event(run_id: Any, key: str, timeout_ms: int = 0, *, using: str | None = None) -> Any:
    """``get_event`` for a coroutine."""
    validate.name("key", key)
    timeout_ms = _timeout(timeout_ms)
    alias = write_alias(WorkflowRun, using)
    look = partial(_event, alias, run_id, key)
    return await await_until_found(alias, run_id, look, timeout_ms, listen=timeout_ms > 0)


def stream_reader(run_id: Any, stream: str, offset: int, timeout_ms: int, using: str | None) -> StreamReader:
    validate.name("stream", stream)
    validate.whole("offset", offset)
    _timeout(timeout_ms)
    return StreamReader(write_alias(WorkflowRun, using), run_id, stream, offset)


def read_stream(
    run_id: Any,
    stream: str,
    offset: int = 0,
    timeout_ms: int = DEFAULT_STREAM_TIMEOUT_MS,
    *,
    using: str | None = None,
) -> Iterator[tuple[int, Any]]:
    """
    ``(offset, item)`` of the run's ``stream`` from ``offset`` on, each once
    and in order, waiting for each next item up to ``timeout_ms`` (which ends
    the iteration quietly); it ends after the last item once the run has finished.
    """
    reader = stream_reader(run_id, stream, offset, timeout_ms, using)
    run_state(reader.alias, run_id)
    return read_items(reader, timeout_ms)


def read_items(reader: StreamReader, timeout_ms: int, *, release: bool = False) -> Iterator[tuple[int, Any]]:
    """``read_stream``'s iteration; ``release`` closes the connection while it waits (``stream_sse``)."""
    ear = listening(reader.alias, reader.run_id)
    try:
        deadline = Deadline(timeout_ms)
        while True:
            status, now, batch = reader.look()
            for offset, item in batch:
                reader.next = offset + 1
                yield offset, item
            if batch:
                deadline.restart()
                continue
            if reader.ended(status):
                return
            ms = deadline.pause_ms(now, heard=ear is not None and ear.live)
            if ms is None:
                return
            pause(ms, ear, release=reader.alias if release else None)
    finally:
        if ear is not None:
            ear.close()


def aread_stream(
    run_id: Any,
    stream: str,
    offset: int = 0,
    timeout_ms: int = DEFAULT_STREAM_TIMEOUT_MS,
    *,
    using: str | None = None,
) -> AsyncIterator[tuple[int, Any]]:
    """``read_stream`` for ``async for``; an unknown run raises at the first item."""
    return aread_items(stream_reader(run_id, stream, offset, timeout_ms, using), timeout_ms)


async def aread_items(
    reader: StreamReader, timeout_ms: int, *, checked: bool = False
) -> AsyncIterator[tuple[int, Any]]:
    """``aread_stream``'s iteration (``checked``: the run is known to exist)."""
    if not checked:
        await sync_to_async(run_state)(reader.alias, reader.run_id)
    ear = await sync_to_async(listening, thread_sensitive=False)(reader.alias, reader.run_id)
    try:
        deadline = Deadline(timeout_ms)
        while True:
            status, now, batch = await sync_to_async(reader.look)()
            for offset, item in batch:
                reader.next = offset + 1
                yield offset, item
            if batch:
                deadline.restart()
                continue
            if reader.ended(status):
                return
            ms = deadline.pause_ms(now, heard=ear is not None and ear.live)
            if ms is None:
                return
            await apause(ms, ear)
    finally:
        if ear is not None:
            ear.close()


__all__ = [
    "DEFAULT_RESULT_TIMEOUT_MS",
    "DEFAULT_STREAM_TIMEOUT_MS",
    "aget_event",
    "aread_stream",
    "await_result",
    "get_event",
    "read_stream",
    "run_state",
    "wait_for_result",
]
