"""
``sql.names.names_held``: which worker names live workers hold now, told
without taking any lock: a name held by another process, or by this one,
is held; one let go of, never taken, or whose process was SIGKILLed is
not, at once; one query on a server whatever the number of names, and on
SQLite no lock file made by looking.
"""

from __future__ import annotations

import os
import signal
import subprocess

from django.db import connection
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.sql.names import NameLock, _lock_path, names_held
from tests.support.children import kill_all, poll_until, read_line, send_line, start_script

#: A process holding the worker names of its arguments until its stdin says "go".
HOLDER = """
import sys
import django
django.setup()
from pikku_django.sql.names import NameLock

locks = [NameLock("default", name) for name in sys.argv[1:]]
assert all(lock.acquire() for lock in locks)
print("held", flush=True)
sys.stdin.readline()
for lock in locks:
    lock.release()
print("released", flush=True)
sys.stdin.readline()
"""


class NamesHeldTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.locks: list[NameLock] = []

    def tearDown(self) -> None:
        kill_all(self.procs)
        for lock in self.locks:
            lock.release()

    def holder(self, *names: str) -> subprocess.Popen[str]:
        proc = start_script(HOLDER, *names)
        self.procs.append(proc)
        assert read_line(proc, timeout=30) == "held\n"
        return proc

    def lock(self, name: str) -> NameLock:
        lock = NameLock(connection.alias, name)
        self.locks.append(lock)
        assert lock.acquire()
        return lock

    def test_names_held_by_another_process_until_it_lets_go(self) -> None:
        proc = self.holder("nh-a", "nh-b")
        assert names_held("default", ["nh-a", "nh-b", "nh-c"]) == {"nh-a", "nh-b"}
        send_line(proc, "go")
        assert read_line(proc, timeout=10) == "released\n"
        # Closing its session releases a lock; the server ends the session right after.
        poll_until(lambda: names_held("default", ["nh-a", "nh-b", "nh-c"]) == set(), timeout=5)

    def test_a_sigkilled_holders_names_are_free_at_once(self) -> None:
        proc = self.holder("nh-killed")
        other = self.holder("nh-alive")
        assert names_held("default", ["nh-killed", "nh-alive"]) == {"nh-killed", "nh-alive"}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # The server ends the dead client's session (and its lock) as soon as it sees it gone.
        poll_until(lambda: names_held("default", ["nh-killed", "nh-alive"]) == {"nh-alive"}, timeout=5)
        send_line(other, "go")

    def test_names_this_process_holds_count_and_looking_takes_nothing(self) -> None:
        mine = self.lock("nh-mine")
        assert names_held("default", ["nh-mine", "nh-free"]) == {"nh-mine"}
        # Looking took no lock: the free name can still be taken, the held one not.
        assert self.lock("nh-free").holds()
        assert not NameLock(connection.alias, "nh-mine").acquire()
        mine.release()
        poll_until(lambda: names_held("default", ["nh-mine"]) == set(), timeout=5)
        assert names_held("default", []) == set()

    def test_one_query_for_many_names(self) -> None:
        self.lock("nh-0")
        names = [f"nh-{i}" for i in range(50)]
        with CaptureQueriesContext(connection) as queries:
            assert names_held("default", names) == {"nh-0"}
        assert len(queries) == (0 if connection.vendor == "sqlite" else 1)

    def test_on_sqlite_looking_makes_no_lock_file(self) -> None:
        if connection.vendor != "sqlite":
            return
        path = _lock_path("default", "nh-never-taken")
        if os.path.exists(path):
            os.unlink(path)
        assert names_held("default", ["nh-never-taken"]) == set()
        assert not os.path.exists(path)
