"""
``pikku_worker``'s first look at its database, in real processes on each
server: one line and exit 1, no traceback, for a database that does not
exist (naming it), one never migrated and one partly migrated; a database
out of reach is waited for, said once.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test import SimpleTestCase

from tests.support.children import ROOT, kill_all, poll_until, subprocess_env

pytestmark = pytest.mark.slow


def manage(*args: str, db: str, timeout: float = 60) -> tuple[int, str]:
    """``manage.py args…`` on the database named ``db`` (on this test's server): exit code and stderr."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=subprocess_env(PIKKU_TEST_DB_NAME=db),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stderr


def create_database(name: str) -> None:
    """A new empty database ``name`` beside the test database (a file path on SQLite)."""
    if connection.vendor == "sqlite":
        Path(name).touch()
        return
    with connection._nodb_cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")


def drop_database(name: str) -> None:
    if connection.vendor == "sqlite":
        Path(name).unlink(missing_ok=True)
        return
    with connection._nodb_cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)}")


def one_line(err: str) -> str:
    """The command's stderr, which must be one line and no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


class WorkerStartupTests(SimpleTestCase):
    databases = {"default"}

    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="pikku-startup-"))
        self.names: list[str] = []

    def tearDown(self) -> None:
        for name in self.names:
            drop_database(name)

    def a_name(self) -> str:
        """A database name of this test's own (a path in a folder of its own on SQLite)."""
        if connection.vendor == "sqlite":
            name = str(self.tmp / f"{uuid.uuid4().hex[:8]}.sqlite3")
        else:
            name = f"{connection.settings_dict['NAME']}_{uuid.uuid4().hex[:8]}"
        self.names.append(name)
        return name

    def test_a_database_that_does_not_exist_is_named_at_once(self) -> None:
        name = self.a_name()
        if connection.vendor == "sqlite":
            name = str(self.tmp / "no-such-dir" / "db.sqlite3")
        code, err = manage("pikku_worker", db=name)
        assert code == 1, err
        line = one_line(err)
        assert "does not exist" in line and repr(name) in line, line
        if connection.vendor == "sqlite":
            # A missing file in a folder that exists is not created empty either.
            name = self.a_name()
            code, err = manage("pikku_worker", db=name)
            assert code == 1 and "does not exist" in one_line(err), err
            assert not Path(name).exists()

    def test_a_database_never_migrated_is_one_line(self) -> None:
        name = self.a_name()
        create_database(name)
        code, err = manage("pikku_worker", db=name)
        assert code == 1, err
        line = one_line(err)
        assert "not migrated" in line and "manage.py migrate" in line and "0001_initial" in line, line

    def test_a_database_partly_migrated_is_one_line(self) -> None:
        name = self.a_name()
        create_database(name)
        code, err = manage("migrate", "pikku_django", "0005", "-v", "0", db=name, timeout=120)
        assert code == 0, err
        code, err = manage("pikku_worker", db=name)
        assert code == 1, err
        line = one_line(err)
        assert "not migrated" in line and "from 0006_" in line and "manage.py migrate" in line, line

    def test_a_database_out_of_reach_is_waited_for_and_said_once(self) -> None:
        if connection.vendor == "sqlite":
            # A path that exists but is no database file SQLite can open.
            settings = {"PIKKU_TEST_DB_NAME": str(self.tmp)}
        else:
            url = "postgres" if connection.vendor == "postgresql" else "mysql"
            # A port nothing listens on.
            settings = {"DATABASE_URL": f"{url}://root@127.0.0.1:9/{connection.settings_dict['NAME']}"}
        env = subprocess_env(**settings)
        if "DATABASE_URL" in settings:
            env.pop("PIKKU_TEST_DB_NAME")
        log = self.tmp / "stderr.log"
        with log.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "pikku_worker"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        try:
            # It says so once it meets the outage (however slowly it starts)...
            poll_until(lambda: "unavailable" in log.read_text() or None, 60)
            # ...then waits through several tries of its back-off, without exiting.
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        finally:
            kill_all([proc])
        err = log.read_text()
        waiting = [line for line in err.splitlines() if "unavailable" in line]
        assert len(waiting) == 1, err
        assert "retrying" in waiting[0] and "Traceback" not in err, err
        assert "ready" not in out
