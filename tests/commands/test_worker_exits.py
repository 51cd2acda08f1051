"""How ``pikku_worker`` and ``pikku_sweep`` end when the database cannot serve them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import SimpleTestCase

from pikku_django.outages import ONCE_GIVES_UP_AFTER_S
from tests.support.children import ROOT, subprocess_env

pytestmark = pytest.mark.slow


#: ``python -c GIVING_UP limit manage.py-args…``: ``manage.py`` with the time
#: ``--once`` waits for a database out of reach cut from ONCE_GIVES_UP_AFTER_S
#: to ``limit`` seconds, so a test sees it give up without waiting a minute.
GIVING_UP = """
import sys
import django
django.setup()
from django.core.management import execute_from_command_line
from pikku_django import outages
from pikku_django.worker import lane, process
limit = float(sys.argv[1])
lane.ONCE_GIVES_UP_AFTER_S = process.ONCE_GIVES_UP_AFTER_S = outages.ONCE_GIVES_UP_AFTER_S = limit
execute_from_command_line(["manage.py", *sys.argv[2:]])
"""

#: The cut limit of the test that waits for it.
GIVES_UP_AFTER_S = 2.0


def command(
    *args: str, db: str, timeout: float, gives_up_after: float | None = None
) -> tuple[int, str, float]:
    """
    Run ``manage.py args…`` on the SQLite file ``db`` (with ``gives_up_after``,
    giving up on it after that many seconds); its exit code, stderr and seconds taken.
    """
    argv = ["manage.py", *args]
    if gives_up_after is not None:
        argv = ["-c", GIVING_UP, str(gives_up_after), *args]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=subprocess_env(PIKKU_TEST_DB_NAME=db),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stderr, time.monotonic() - started


class UnservedDatabaseTests(SimpleTestCase):
    def setUp(self) -> None:
        if connection.vendor != "sqlite":
            pytest.skip("an unmigrated or unreachable database file is SQLite's; the rule is vendor-free")
        self.tmp = Path(tempfile.mkdtemp(prefix="pikku-exits-"))

    def test_an_unmigrated_database_is_an_error_at_once(self) -> None:
        empty = str(self.tmp / "empty.sqlite3")
        # A file that exists, empty (a missing one is a database that does not exist).
        Path(empty).touch()
        for args in (["pikku_worker", "--once"], ["pikku_worker", "--once", "--concurrency", "3"]):
            code, err, took = command(*args, db=empty, timeout=60)
            assert code == 1, err
            assert "not migrated" in err and "manage.py migrate" in err, err
            assert took < ONCE_GIVES_UP_AFTER_S / 2
        code, err, _ = command("pikku_sweep", db=empty, timeout=60)
        assert code == 1 and "not migrated" in err, err

    def test_once_gives_up_on_a_database_out_of_reach(self) -> None:
        # A path that exists but that SQLite cannot open (a missing one is a
        # database that does not exist: tests/commands/test_worker_startup.py).
        unreachable = str(self.tmp)
        code, err, took = command(
            "pikku_worker", "--once", db=unreachable, timeout=60, gives_up_after=GIVES_UP_AFTER_S
        )
        assert code == 1, err
        assert "unreachable" in err and "giving up" in err, err
        # It waited the database out for its whole limit, and not much longer.
        assert GIVES_UP_AFTER_S <= took < GIVES_UP_AFTER_S + 30, (took, err)

    def test_once_gives_up_after_a_minute(self) -> None:
        # Under cron, runs of --once never pile up: the limit the test above cuts short.
        assert ONCE_GIVES_UP_AFTER_S == 60.0
