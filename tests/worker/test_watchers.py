"""
The loops that wake a worker's lanes on other processes' commits where the
database sends no NOTIFY: SQLite's file watcher, MariaDB's wake file and
the due look.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection, transaction
from django.test import TransactionTestCase

from pikku_django import wakeups
from pikku_django.models import WorkflowRun
from pikku_django.sql import notify, wake_files
from pikku_django.worker import Worker, watchers
from pikku_django.worker.watchers import DueLook, FileWatcher
from pikku_django.workflows import start_workflow
from tests.support.children import ROOT, subprocess_env

#: Another process's commit: SQLite's header field for the application's use.
OTHER_PROCESS_COMMIT = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=30)
version = db.execute("PRAGMA user_version").fetchone()[0]
db.execute(f"PRAGMA user_version = {version + 1}")
db.commit()
db.close()
"""


def woke(poll: object) -> bool:
    """Did one poll of a watcher wake the lanes?"""
    before = wakeups.nudges()
    poll()  # type: ignore[operator]
    return wakeups.nudges() != before


def roll_back_a_start() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        start_workflow("test.noop", {"n": 1})
        raise RuntimeError("roll back")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the file watcher is SQLite's")
class FileWatcherTests(TransactionTestCase):
    def setUp(self) -> None:
        path = notify.sqlite_file("default")
        assert path is not None
        self.path = path
        self.watcher = FileWatcher(path, f"{path}-wal")
        self.addCleanup(self.watcher.stop)

    def test_another_processs_commit_wakes(self) -> None:
        subprocess.run([sys.executable, "-c", OTHER_PROCESS_COMMIT, self.path], check=True, timeout=60)
        assert woke(self.watcher.poll)
        assert not woke(self.watcher.poll)

    def test_no_change_no_wake(self) -> None:
        assert not woke(self.watcher.poll)
        # Reads change neither file, nor does opening a connection (which
        # may create an empty -wal).
        connection.close()
        assert not WorkflowRun.objects.exists()
        assert not woke(self.watcher.poll)

    def test_a_rolled_back_start_wakes_nobody(self) -> None:
        before = wakeups.nudges()
        roll_back_a_start()
        assert wakeups.nudges() == before
        assert not woke(self.watcher.poll)
        start_workflow("test.noop", {"n": 1})
        assert woke(self.watcher.poll)

    def test_changes_within_the_gap_wake_once_the_gap_has_passed(self) -> None:
        start_workflow("test.noop", {"n": 1})
        assert woke(self.watcher.poll)
        # A second commit right after the wake-up: not woken for yet...
        start_workflow("test.noop", {"n": 2})
        self.watcher.woke_at = float("inf")
        assert not woke(self.watcher.poll)
        # ... but once the gap has passed, with no further change.
        self.watcher.woke_at = float("-inf")
        assert woke(self.watcher.poll)
        assert not woke(self.watcher.poll)

    def test_an_in_memory_database_is_not_watched(self) -> None:
        settings = connection.settings_dict
        name = settings["NAME"]
        try:
            settings["NAME"] = ":memory:"
            assert notify.sqlite_file("default") is None
        finally:
            settings["NAME"] = name


#: A start committed by another process (another worker, a web request).
OTHER_PROCESS_START = """
import django
django.setup()
from pikku_django.workflows import start_workflow
start_workflow("test.noop", {"n": 1})
"""


@pytest.mark.skipif(wake_files.wake_file("default") is None, reason="only MariaDB/MySQL has a wake file")
class WakeFileTests(TransactionTestCase):
    def setUp(self) -> None:
        path = wake_files.wake_file("default")
        assert path is not None
        self.path = path
        self.watcher = FileWatcher(path)
        self.addCleanup(self.watcher.stop)

    def test_a_committed_start_wakes_a_watcher_of_the_wake_file(self) -> None:
        assert not woke(self.watcher.poll)
        start_workflow("test.noop", {"n": 1})
        assert woke(self.watcher.poll)
        assert not woke(self.watcher.poll)

    def test_a_rolled_back_start_leaves_the_wake_file_as_it_was(self) -> None:
        roll_back_a_start()
        assert not woke(self.watcher.poll)

    def test_another_processs_start_wakes(self) -> None:
        subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS_START],
            cwd=ROOT,
            env=subprocess_env(),
            check=True,
            timeout=60,
        )
        assert woke(self.watcher.poll)

    def test_every_start_changes_it_and_it_stays_small(self) -> None:
        # Two starts within one tick of the file system's clock still change
        # it (its size does), and it is cut back before it grows past MAX_BYTES.
        for n in range(wake_files.MAX_BYTES + 5):
            before = watchers.signature(self.path)
            wake_files.touch("default")
            assert watchers.signature(self.path) != before, n
        assert os.path.getsize(self.path) <= wake_files.MAX_BYTES

    def test_a_wake_file_that_cannot_be_written_is_passed_over(self) -> None:
        settings = connection.settings_dict
        host = settings["HOST"]
        try:
            # Another server's name, whose file is made a directory: it cannot be written.
            settings["HOST"] = "unwritable.invalid"
            path = wake_files.wake_file("default")
            assert path is not None and path != self.path
            os.makedirs(path, exist_ok=True)
            self.addCleanup(os.rmdir, path)
            wake_files.touch("default")
        finally:
            settings["HOST"] = host
        assert os.path.isdir(path)

    def test_a_worker_watches_the_wake_file_and_looks_for_other_hosts(self) -> None:
        loops = watchers.watchers(Worker(holder="wake-file", interval=60))
        assert [type(loop) for loop in loops] == [DueLook, FileWatcher]
        assert loops[1].paths == (self.path,)


class DueLookTests(TransactionTestCase):
    def setUp(self) -> None:
        self.worker = Worker(holder="look", interval=60)
        self.look = DueLook(self.worker)

    def test_a_committed_start_wakes_once(self) -> None:
        assert self.look.interval == watchers.LOOK_S
        assert not woke(self.look.poll)
        start_workflow("test.noop", {"n": 1})
        assert woke(self.look.poll)
        # The same run still due: woken for again only after --interval.
        assert not woke(self.look.poll)
        self.look.woke_at -= 60
        assert woke(self.look.poll)

    def test_a_rolled_back_start_wakes_nobody(self) -> None:
        roll_back_a_start()
        assert not woke(self.look.poll)

    def test_only_the_workers_queues_are_looked_at(self) -> None:
        look = DueLook(Worker(holder="look-b", interval=60, queues=["b"]))
        start_workflow("test.noop", {"n": 1}, queue="a")
        assert not woke(look.poll)
        start_workflow("test.noop", {"n": 2}, queue="b")
        assert woke(look.poll)

    def test_lanes_poll_rarely_only_where_the_look_runs(self) -> None:
        lane_interval = Worker(holder="lanes", interval=1).lane_interval()
        once = Worker(holder="once", interval=1, once=True).lane_interval()
        assert once == 1
        if watchers.looks_for_lanes("default"):
            assert lane_interval == watchers.LANE_FALLBACK_S
        else:
            assert lane_interval == 1
