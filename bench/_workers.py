"""Starting and stopping the worker processes a benchmark times, and timing until work is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _setup import ROOT
from django.db import connection


def connected(pid: int) -> bool:
    """Has the process opened a socket or the SQLite file (its database connection)? Linux only."""
    fds = Path(f"/proc/{pid}/fd")
    name = str(connection.settings_dict["NAME"])
    try:
        targets = [os.readlink(fd) for fd in fds.iterdir()]
    except (FileNotFoundError, PermissionError):
        return False
    return any(t.startswith("socket:") or t == name for t in targets)


def with_module(module: str) -> str:
    """
    A ``python -c`` script that runs ``manage.py args…`` with ``module``
    imported first: the bench's tasks and workflows live outside any
    installed app, and a worker runs only the ones it knows.
    """
    return (
        "import sys\nimport django\ndjango.setup()\n"
        f"import {module}\n"
        "from django.core.management import execute_from_command_line\n"
        'execute_from_command_line(["manage.py", *sys.argv[1:]])\n'
    )


def start_worker(module: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """
    ``manage.py args…`` (a worker) with ``module`` imported, once it has
    connected to the database; ``env`` adds to this process's environment.
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-c", with_module(module), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not connected(proc.pid):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker {args} did not connect: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.02)
    return proc


def stop_worker(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def timed(done: Callable[[], bool], timeout: float = 600) -> float:
    started = time.perf_counter()
    deadline = started + timeout
    while not done():
        if time.perf_counter() > deadline:
            raise SystemExit("the tasks did not finish within the timeout")
        time.sleep(0.02)
    return time.perf_counter() - started
