"""
A worker's name is its own while it runs (``managers.names``): a second
live worker under the same ``--holder`` refuses to start (exit 1, naming
it); a worker that dies, even SIGKILLed, lets go of its name at once; and
holding the name writes nothing, so an idle worker writes no row at all.
"""

from __future__ import annotations

import signal
import time
from unittest import skipIf

import pytest
from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import Lease
from pikku_django.sql.names import NameLock
from pikku_django.worker import Worker
from pikku_django.worker.loops import NameLoop
from tests.support.children import subprocess_env
from tests.support.workers import WorkerProcessTestCase

pytestmark = pytest.mark.slow


#: The lease ttl of the idle worker's test.
IDLE_TTL_MS = 1_500


class NameLockTests(TransactionTestCase):
    def test_one_holder_per_name_until_it_lets_go(self) -> None:
        first, second, other = (NameLock(connection.alias, n) for n in ("w-1", "w-1", "w-2"))
        try:
            assert first.acquire()
            assert not second.acquire()
            assert other.acquire()
            assert first.holds()
            first.release()
            assert second.acquire()
            assert not first.acquire()
        finally:
            for lock in (first, second, other):
                lock.release()

    def test_holding_a_name_writes_no_row(self) -> None:
        lock = NameLock(connection.alias, "w-quiet")
        try:
            assert lock.acquire()
            assert lock.holds()
            assert not Lease.objects.exists()
        finally:
            lock.release()


def end_session(lock: NameLock) -> None:
    """End the lock's session on the server, as a restart would."""
    assert lock._connection is not None
    with lock._connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
        )
        (pid,) = cursor.fetchone()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        else:
            cursor.execute(f"KILL {int(pid)}")


@skipIf(connection.vendor == "sqlite", "a file lock has no session a server could end")
class NameSessionTests(TransactionTestCase):
    def test_a_lock_whose_session_ended_is_taken_again_unless_another_worker_took_the_name(self) -> None:
        worker = Worker(holder="w-loop")
        lock, thief = NameLock(connection.alias, "w-loop"), NameLock(connection.alias, "w-loop")
        loop = NameLoop(worker, lock)
        try:
            assert lock.acquire()
            end_session(lock)
            # The loop's check finds the session gone and takes the lock again.
            assert loop.poll() is False
            assert lock.holds() and not worker.stopping.is_set()
            assert not thief.acquire()
            end_session(lock)
            # Another worker took the name meanwhile: this one stops.
            assert thief.acquire()
            loop.poll()
            assert worker.stopping.is_set()
        finally:
            lock.release()
            thief.release()


class WorkerNameProcessTests(WorkerProcessTestCase):
    def test_a_second_live_worker_under_the_same_name_refuses_to_start(self) -> None:
        first = self.worker("--holder", "twin")
        self.ready(first, "twin")
        second = self.worker("--holder", "twin")
        code, _ = self.exits(second, timeout=60)
        assert code == 1, self.log(second)
        assert "Another live worker is named 'twin'" in self.log(second)
        self.stop(first, "twin")
        # Its name is free again once it has stopped.
        third = self.worker("--holder", "twin")
        self.ready(third, "twin")
        self.stop(third, "twin")

    def test_a_sigkilled_workers_name_is_free_at_once(self) -> None:
        killed = self.worker("--holder", "phoenix")
        self.ready(killed, "phoenix")
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=10) == -signal.SIGKILL
        # No lease to wait out: the name went with the process.
        again = self.worker("--holder", "phoenix")
        self.ready(again, "phoenix")
        self.stop(again, "phoenix")

    def test_an_idle_worker_writes_no_row(self) -> None:
        # Leases of 1.5 s: a name lease would be renewed every 0.5 s.
        env = subprocess_env(PIKKU_LEASE_TTL_MS=str(IDLE_TTL_MS))
        proc = self.worker("--holder", "idle", "--concurrency", "2", "--sweep-interval", "1", env=env)
        self.ready(proc, "idle")
        before = sorted(Lease.objects.values_list("key", "token", "expires_at"))
        # Longer than a name lease's ttl, so longer than several of its
        # renewals (a third of the ttl) would have been, and two sweep intervals.
        time.sleep(IDLE_TTL_MS / 1000 + 1)
        assert sorted(Lease.objects.values_list("key", "token", "expires_at")) == before
        assert not Lease.objects.filter(key__contains="idle").exists()
        self.stop(proc, "idle")
