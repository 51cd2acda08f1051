"""
Hearing a run's commits, for its readers in this process: where the
database carries notifications (PostgreSQL), one daemon thread per database
alias LISTENs on ``pikku_results`` on a connection of its own (autocommit,
never Django's) and wakes the ears waiting on the run each payload names
(``sql.notify.announce_results``). Elsewhere there is no ear and readers poll.

A missed notification costs a reader one longer pause (``waiting.HEARD_POLL_MS``),
never a result: every wait ends in a look at the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import threading
import time
from typing import Any

from django.db import connections

from pikku_django.sql.notify import RESULTS_CHANNEL, carries_notifications, run_key

logger = logging.getLogger(__name__)

#: How long a reader waits for a new hub to listen before its first look.
READY_TIMEOUT_S = 2.0

#: Seconds between two tries of a hub whose connection failed.
RECONNECT_S = 1.0

#: Seconds a hub with no ear listens on before it closes its connection and ends.
IDLE_S = 30.0

#: The longest a hub's wait on its socket lasts (how soon it sees a stop).
LISTEN_WAIT_S = 0.25


class Ear:
    """One reader's ear on one run: ``wait`` (or ``await_``) ends early once a commit for it is heard."""

    def __init__(self, hub: Hub, run_key: str) -> None:
        self.hub = hub
        self.run_key = run_key
        self._heard = threading.Event()
        self._lock = threading.Lock()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def live(self) -> bool:
        """Is the hub listening now (else the reader polls at the short interval)?"""
        return self.hub.live

    def hear(self) -> None:
        """A commit for the run was heard (on the hub's thread)."""
        self._heard.set()
        with self._lock:
            futures, self._futures = self._futures, []
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # a loop already closed
                loop.call_soon_threadsafe(_settle, future)

    def wait(self, timeout_s: float) -> None:
        self._heard.wait(timeout_s)
        self._heard.clear()

    async def await_(self, timeout_s: float) -> None:
        if not self._heard.is_set():
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._futures.append((loop, future))
            try:
                await asyncio.wait_for(future, timeout_s)
            except asyncio.TimeoutError:
                pass
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._futures.remove((loop, future))
        self._heard.clear()

    def close(self) -> None:
        self.hub.drop(self)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Hub(threading.Thread):
    """The LISTEN of one database alias, shared by every reader of this process."""

    def __init__(self, alias: str) -> None:
        super().__init__(name=f"pikku-results:{alias}", daemon=True)
        self.alias = alias
        self.live = False
        self.ready = threading.Event()
        self._ears: dict[str, set[Ear]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._idle_since = time.monotonic()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """End the hub (its connection closed) within ``LISTEN_WAIT_S``."""
        self._stopping.set()

    def _idle(self) -> bool:
        with self._lock:
            if self._ears:
                self._idle_since = time.monotonic()
                return False
        return time.monotonic() - self._idle_since > IDLE_S

    def add(self, run_key: str) -> Ear:
        ear = Ear(self, run_key)
        with self._lock:
            self._idle_since = time.monotonic()
            self._ears.setdefault(run_key, set()).add(ear)
        return ear

    def drop(self, ear: Ear) -> None:
        with self._lock:
            ears = self._ears.get(ear.run_key)
            if ears is not None:
                ears.discard(ear)
                if not ears:
                    del self._ears[ear.run_key]

    def run(self) -> None:
        while not self._stopping.is_set():
            raw: Any = None
            try:
                wrapper = connections[self.alias]
                raw = wrapper.get_new_connection(wrapper.get_connection_params())
                raw.autocommit = True
                raw.cursor().execute(f"LISTEN {RESULTS_CHANNEL}")
                self.live = True
                self.ready.set()
                while not self._stopping.is_set() and not self._idle():
                    for payload in _heard(raw, LISTEN_WAIT_S):
                        self._wake(payload)
                self._stopping.set()
            except Exception:
                logger.warning(
                    "Listening for run results on %r failed; readers poll.", self.alias, exc_info=True
                )
            self.live = False
            self.ready.set()
            if raw is not None:
                with contextlib.suppress(Exception):
                    raw.close()
            # Readers poll meanwhile; their waits end in a look, so nothing is missed.
            self._wake_all()
            self._stopping.wait(RECONNECT_S)

    def _wake(self, payload: str) -> None:
        with self._lock:
            ears = list(self._ears.get(payload, ()))
        for ear in ears:
            ear.hear()

    def _wake_all(self) -> None:
        with self._lock:
            ears = [ear for group in self._ears.values() for ear in group]
        for ear in ears:
            ear.hear()


def _heard(raw: Any, timeout_s: float) -> list[str]:
    """The payloads of the notifications that arrive within ``timeout_s`` (psycopg 3 or psycopg2)."""
    if callable(getattr(raw, "notifies", None)):
        first = [n.payload for n in raw.notifies(timeout=timeout_s, stop_after=1)]
        if not first:
            return []
        # Whatever else has arrived meanwhile, without waiting.
        return first + [n.payload for n in raw.notifies(timeout=0)]
    if select.select([raw], [], [], timeout_s) == ([], [], []):
        return []
    raw.poll()
    payloads = [n.payload for n in raw.notifies]
    raw.notifies.clear()
    return payloads


_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def stop_hubs() -> None:
    """End every hub of this process, their connections closed (a test's teardown, a fork)."""
    with _hubs_lock:
        hubs = list(_hubs.values())
        _hubs.clear()
    for hub in hubs:
        hub.stop()
    for hub in hubs:
        hub.join(LISTEN_WAIT_S * 8)


def ear(alias: str, run_id: Any) -> Ear | None:
    """An ear on ``run_id``'s commits on ``alias``, or None where the database carries no notifications."""
    if not carries_notifications(alias):
        return None
    with _hubs_lock:
        hub = _hubs.get(alias)
        if hub is None or not hub.is_alive() or hub.stopping:
            hub = _hubs[alias] = Hub(alias)
            hub.start()
    # A commit between this reader's first look and the LISTEN would go unheard.
    hub.ready.wait(READY_TIMEOUT_S)
    return hub.add(run_key(run_id))


__all__ = ["Ear", "Hub", "ear", "stop_hubs"]
