"""Fixtures and small factories shared by the test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from pikku_django.models import Lease

ROOT = Path(__file__).resolve().parent.parent


def lapse(key: str, ago_ms: int = 1) -> None:
    """Move a lease's expiry into the past on the database clock (no sleeping)."""
    now = Lease.objects.db_now_ms()
    Lease.objects.filter(key=key).update(expires_at=now - ago_ms)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that must use the live test database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env["PIKKU_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_script(code: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
               prefix: list[str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -c code args…`` against the live test database."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
