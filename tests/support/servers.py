"""
Stopping and starting the test database's server, with the commands .ci/run
uses, for the tests that prove the worker and the sweep outlive a restart.
They need root, as CI has; without it they fail, never skip.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import OperationalError, connection

MARIADBD = "/usr/sbin/mariadbd"


def _pg_cluster() -> list[str]:
    version = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])[-1]
    return ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main"]


def stop_server() -> None:
    """Stop the server the test database lives on; returns once it is down."""
    if connection.vendor == "postgresql":
        command = [*_pg_cluster(), "stop", "-m", "fast"]
    elif connection.vendor == "mysql":
        command = ["start-stop-daemon", "--stop", "--oknodo", "--retry", "TERM/30/KILL/5", "--exec", MARIADBD]
    else:
        raise AssertionError(f"no server to stop for {connection.vendor}")
    subprocess.run(command, check=True, timeout=60, capture_output=True)


def start_server() -> None:
    """Start it again (a no-op if it is up)."""
    if connection.vendor == "postgresql":
        if subprocess.run([*_pg_cluster(), "status"], capture_output=True, timeout=30).returncode == 0:
            return
        command = [*_pg_cluster(), "start"]
    else:
        command = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", MARIADBD]
    subprocess.run(command, check=True, timeout=60, capture_output=True)


def wait_until_it_answers(timeout: float = 60) -> float:
    """Reconnect this process's connection until the server answers; the seconds it took."""
    started = time.monotonic()
    while True:
        connection.close()
        try:
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return time.monotonic() - started
        except OperationalError:
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.1)


@contextmanager
def server_down() -> Iterator[None]:
    """Stop the server for the body; it is up again and answering after, whatever happened."""
    stop_server()
    try:
        yield
    finally:
        start_server()
        wait_until_it_answers()
