"""
The loop a worker runs to hear other processes' commits where the database
carries them (PostgreSQL's LISTEN/NOTIFY, ``sql.notify``).
"""

from __future__ import annotations

import contextlib
import logging
import select
from typing import Any

from django.db import connections

from pikku_django import wakeups
from pikku_django.sql.notify import CHANNEL
from pikku_django.worker.poller import Poller

logger = logging.getLogger(__name__)


class Listener(Poller):
    """
    Listens on ``pikku_work`` on a connection of its own (autocommit, never
    shared with Django's) and turns each notification into a wake-up of this
    process's loops. A dropped connection is an outage: reconnected after the
    back-off, and until then the workers poll.
    """

    wakes = False
    restarts = True

    def __init__(self, using: str, **kwargs: Any) -> None:
        super().__init__(f"pikku-listener:{using}", **kwargs)
        self.using = using
        self._raw: Any = None

    def poll(self) -> bool:
        wrapper = connections[self.using]
        with wrapper.wrap_database_errors:
            try:
                if self._raw is None:
                    self._raw = wrapper.get_new_connection(wrapper.get_connection_params())
                    self._raw.autocommit = True
                    self._raw.cursor().execute(f"LISTEN {CHANNEL}")
                    # Work may have been made due before we listened.
                    wakes = 1
                else:
                    wakes = self._wait(self.interval)
            except Exception:
                self._close()
                raise
        if wakes:
            # One lane: it wakes the next if it finds more than one run due.
            wakeups.nudge()
        # The wait is in the poll itself (on the socket): poll again at once.
        return True

    def _wait(self, timeout: float) -> int:
        raw = self._raw
        if callable(getattr(raw, "notifies", None)):
            # psycopg 3: a generator that ends after the timeout.
            return sum(1 for _ in raw.notifies(timeout=timeout, stop_after=1))
        # psycopg2: wait for the socket, then read what arrived.
        if select.select([raw], [], [], timeout) == ([], [], []):
            return 0
        raw.poll()
        count = len(raw.notifies)
        raw.notifies.clear()
        return count

    def teardown(self) -> None:
        self._close()
        super().teardown()

    def _close(self) -> None:
        if self._raw is not None:
            # A dead connection may fail to close; it is dropped anyway.
            with contextlib.suppress(Exception):
                self._raw.close()
            self._raw = None
