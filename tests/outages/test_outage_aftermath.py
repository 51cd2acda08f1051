"""
A loop that waited through an outage (a scheduler asleep between ticks)
makes its connections anew before it polls, instead of meeting the dropped
connection after the outage ended and logging an outage of its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.test import TransactionTestCase

from pikku_django.outages import Outage
from pikku_django.worker.poller import Poller

pytestmark = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="a server closing a connection: PostgreSQL and MariaDB"
)


def backend_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def end_backend(backend: int) -> None:
    """Close connection ``backend`` on the server, from a connection of its own."""
    side = connections.create_connection("default")
    try:
        with side.cursor() as cursor:
            if side.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
            else:
                cursor.execute(f"KILL {int(backend)}")
    finally:
        side.close()


def another_loop_meets_an_outage() -> None:
    """On a thread of its own, as another loop of the process (its failure drops its own connections)."""
    other = Outage("test-other")
    other.failed(OSError("server restarting"))
    other.succeeded()


class Sleeper(Poller):
    """
    Two polls, and between them, while it waits, the server restarts: its
    connection is closed, and another loop of the process meets the outage
    and its end.
    """

    def __init__(self) -> None:
        super().__init__("test-sleeper", interval=0.01)
        self.polls: list[str] = []
        self.backend: int | None = None
        self.restarted = False

    def poll(self) -> bool:
        if not self.polls:
            self.backend = backend_id()
            self.polls.append("first")
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        self.polls.append("second")
        self.stopping.set()
        return False

    def finished(self) -> bool:
        # Asked after each poll has been counted a success: the restart falls in the wait.
        if self.backend is not None and not self.restarted:
            self.restarted = True
            end_backend(self.backend)
            thread = threading.Thread(target=another_loop_meets_an_outage)
            thread.start()
            thread.join()
        return False

    def teardown(self) -> None:
        """The test's connection stays."""


class OutageAftermathTests(TransactionTestCase):
    def test_a_loop_that_waited_through_an_outage_reconnects_without_an_outage_of_its_own(self) -> None:
        loop = Sleeper()
        records: list[Any] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign,assignment]
        outages = logging.getLogger("pikku_django.outages")
        outages.addHandler(handler)
        try:
            loop.run()
        finally:
            outages.removeHandler(handler)
        assert loop.polls == ["first", "second"]
        # The second poll went through at its first try.
        assert loop.outage.failures == 0
        mine = [record.getMessage() for record in records if record.getMessage().startswith("test-sleeper")]
        assert mine == []
