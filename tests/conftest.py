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


def run_script(
    code: str,
    *args: str,
    timeout: float = 120,
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


# -- child processes with a stdin handshake ------------------------------------


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
    import select
    import time

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
    import contextlib

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


def poll_until(check, timeout: float, interval: float = 0.02):  # type: ignore[no-untyped-def]
    """Call ``check()`` until it returns something truthy, or fail after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def make_run(workflow: str = "order", **kwargs):  # type: ignore[no-untyped-def]
    """A fresh running run."""
    from pikku_django.models import WorkflowRun

    return WorkflowRun.objects.create_run(workflow, **kwargs)


def make_step(run=None, step_name: str = "charge", rpc_name: str = "shop.charge", **kwargs):  # type: ignore[no-untyped-def]
    """A fresh pending step (on a fresh run unless one is given)."""
    from pikku_django.models import WorkflowStep

    return WorkflowStep.objects.insert_step(run or make_run(), step_name, rpc_name, **kwargs)


def lapse_step(step, ago_ms: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Move a step's lease into the past on the database clock (no sleeping)."""
    from pikku_django.models import Lease, WorkflowStep

    now = Lease.objects.db_now_ms()
    WorkflowStep.objects.filter(pk=step.pk).update(lease_expires_at=now - ago_ms)


def age(model, pk, ms: int) -> None:  # type: ignore[no-untyped-def]
    """Move a row's updated_at ``ms`` into the past."""
    import datetime

    from django.db.models import F

    model.objects.filter(pk=pk).update(updated_at=F("updated_at") - datetime.timedelta(milliseconds=ms))
