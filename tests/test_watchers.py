"""
The loops that wake a worker's lanes on other processes' commits where the
database sends no NOTIFY: SQLite's file watcher and the due look.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection, transaction
from django.test import TransactionTestCase

from pikku_django import wakeups, watchers
from pikku_django.models import WorkflowRun
from pikku_django.watchers import DueLook, FileWatcher
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow

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
        path = watchers.watched_file("default")
        assert path is not None
        self.path = path
        self.watcher = FileWatcher(path)
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
            assert watchers.watched_file("default") is None
        finally:
            settings["NAME"] = name


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
