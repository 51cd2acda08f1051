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
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.slow


def command(*args: str, db: str, timeout: float) -> tuple[int, str, float]:
    """Run ``manage.py args…`` on the SQLite file ``db``; its exit code, stderr and seconds taken."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
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
        for args in (["pikku_worker", "--once"], ["pikku_worker", "--once", "--concurrency", "3"]):
            code, err, took = command(*args, db=empty, timeout=60)
            assert code == 1, err
            assert "not migrated" in err and "manage.py migrate" in err, err
            assert took < ONCE_GIVES_UP_AFTER_S / 2
        code, err, _ = command("pikku_sweep", db=empty, timeout=60)
        assert code == 1 and "not migrated" in err, err

    def test_once_gives_up_on_a_database_out_of_reach(self) -> None:
        unreachable = str(self.tmp / "no-such-dir" / "db.sqlite3")
        code, err, took = command(
            "pikku_worker", "--once", db=unreachable, timeout=ONCE_GIVES_UP_AFTER_S + 60
        )
        assert code == 1, err
        assert "unreachable" in err and "giving up" in err, err
        assert ONCE_GIVES_UP_AFTER_S <= took < ONCE_GIVES_UP_AFTER_S + 30
