"""
How a reader of a run waits (``wait_for_result``, ``get_event``,
``read_stream``): a deadline on the database clock, and pauses between two
looks that a commit for the run cuts short where the database says so
(PostgreSQL's NOTIFY, ``workflows.hearing``), else a poll of at most
``POLL_MS``. A waiter only reads: one that times out or is cancelled
changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.db import connections

from pikku_django.workflows import hearing

#: The longest pause between two looks where no NOTIFY wakes a waiter.
POLL_MS = 100

#: The longest pause between two looks where a NOTIFY wakes a waiter (a
#: missed notification, or a listener that lost its connection, costs this).
HEARD_POLL_MS = 1_000


class Deadline:
    """
    A wait's deadline on the database clock: set by the first look that finds
    nothing (``timeout_ms`` after that look's now), met once a look's now reaches it.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.at: int | None = None

    def pause_ms(self, now: int, *, heard: bool = False) -> int | None:
        """How long to pause after a look at ``now`` (DB clock ms); None once the deadline has passed."""
        if self.at is None:
            self.at = now + self.timeout_ms
        if now >= self.at:
            return None
        return min(HEARD_POLL_MS if heard else POLL_MS, self.at - now)

    def restart(self) -> None:
        """The next look that finds nothing starts a new deadline (a stream's next item)."""
        self.at = None


def listening(alias: str, run_id: Any) -> hearing.Ear | None:
    """An ear on ``run_id``'s commits where the database carries them (PostgreSQL), else None."""
    return hearing.ear(alias, run_id)


def pause(ms: int, ear: hearing.Ear | None, *, release: str | None = None) -> None:
    """
    Pause ``ms`` milliseconds, or less once ``ear`` hears a commit for its
    run. ``release``: close that alias's connection first (outside a
    transaction), so a long wait (a stream to a browser) holds none.
    """
    if release is not None:
        connection = connections[release]
        if not connection.in_atomic_block:
            connection.close()
    if ear is None:
        time.sleep(ms / 1000)
    else:
        ear.wait(ms / 1000)


async def apause(ms: int, ear: hearing.Ear | None) -> None:
    """``pause`` for a coroutine: the event loop runs on meanwhile."""
    if ear is None:
        await asyncio.sleep(ms / 1000)
    else:
        await ear.await_(ms / 1000)


__all__ = ["HEARD_POLL_MS", "POLL_MS", "Deadline", "apause", "listening", "pause"]
