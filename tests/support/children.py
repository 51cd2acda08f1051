"""
Child processes on the live test database: the environment that points a
child at this worker's test database, starting ``python -c`` scripts, a
line-by-line stdin/stdout handshake with them, and reaping them.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.db import connection

#: The checkout: the children's working directory and import root.
ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def subprocess_env(**extra: str) -> dict[str, str]:
    """
    The environment for a child process that must use the live test database:
    the name this process's connection uses (so under pytest-xdist, each
    worker's own, e.g. ``test_test_gw0``), whatever ``DATABASE_URL`` says.
    """
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env["PIKKU_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_script(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> subprocess.Popen[str]:
    """Start ``python -c code args…`` against the live test database."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_script(
    code: str, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> subprocess.Popen[str]:
    """Like ``run_script``, with a pipe on stdin too, for a "go" handshake."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """
    One line from ``proc``'s stdout within ``timeout`` seconds, or AssertionError
    (with the child's stderr if it died). Reads the raw descriptor a byte at a time
    so nothing is left in a Python buffer that a later ``communicate()`` would miss.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise AssertionError(f"no line from child {proc.pid} within {timeout} s (got {line!r})")
        byte = os.read(fd, 1)
        if not byte:
            proc.wait(timeout=timeout)
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child {proc.pid} exited {proc.returncode} before a line: {line!r}\n{err}")
        line += byte
    return line.decode()


def send_line(proc: subprocess.Popen[str], text: str) -> None:
    """Write one line to ``proc``'s stdin and flush it."""
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """Wait for ``proc`` (closing its stdin), assert it exited 0, return its stdout."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child {proc.pid} exited {proc.returncode}:\n{err}"
    return out


def kill_all(procs: list[subprocess.Popen[str]]) -> None:
    """Teardown: kill every child still running, reap it and close its pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        finally:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):  # a dead child's stdin may not flush
                        pipe.close()


def poll_until(check: Callable[[], T | None], timeout: float, interval: float = 0.02) -> T:
    """Call ``check()`` until it returns something truthy (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
