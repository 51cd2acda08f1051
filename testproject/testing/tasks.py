"""Django Tasks the tests enqueue and worker processes run (see TASKS in testproject.settings)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from typing import Any

from pikku_django.models import Lease
from pikku_django.tasks import set_progress
from pikku_django.tasks.compat import TaskContext, task
from testproject.testing.models import PassRecord, StepCall


def _record(context: TaskContext[..., Any], label: str) -> None:
    StepCall.objects.create(
        run_id=uuid.UUID(context.task_result.id), step=label, pid=os.getpid(), at_ms=Lease.objects.db_now_ms()
    )


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
async def add_later(a: int, b: int) -> int:
    """A coroutine task: awaits, then adds."""
    await asyncio.sleep(0.01)
    return a + b


@task()
def explode(message: str) -> None:
    raise ValueError(message)


@task(backend="retrying", takes_context=True)
def flaky(context: TaskContext[..., Any], succeed_on: int) -> dict[str, Any]:
    """Fails every attempt before ``succeed_on``."""
    _record(context, f"attempt {context.attempt}")
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt}


@task(backend="retrying", takes_context=True)
def block_first_attempt(context: TaskContext[..., Any]) -> str:
    """Blocks for good on its first attempt (until its worker is killed)."""
    _record(context, f"attempt {context.attempt}")
    while context.attempt == 1:
        time.sleep(0.05)
    return "done"


@task(takes_context=True)
def note(context: TaskContext[..., Any], label: str) -> str:
    """Records that it ran (and when, on the DB clock)."""
    _record(context, label)
    return label


@task()
def nap(ms: int) -> None:
    """Waits ``ms`` milliseconds, writing nothing (as a task waiting on the network would)."""
    time.sleep(ms / 1000)


@task(takes_context=True)
def noted_nap(context: TaskContext[..., Any], label: str, ms: int) -> str:
    """Records that it started, then waits ``ms`` milliseconds."""
    _record(context, label)
    time.sleep(ms / 1000)
    return label


@task(takes_context=True)
def noted_wait(context: TaskContext[..., Any], label: str, path: str) -> str:
    """Records that it started, then waits until a file exists at ``path`` (for at most 60 s)."""
    _record(context, label)
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return label


@task(takes_context=True)
def slow(context: TaskContext[..., Any], ms: int) -> str:
    """Takes ``ms`` milliseconds; its start and end are recorded on the DB clock."""
    start = Lease.objects.db_now_ms()
    time.sleep(ms / 1000)
    end = Lease.objects.db_now_ms()
    PassRecord.objects.create(
        run_id=uuid.UUID(context.task_result.id), pid=os.getpid(), start_ms=start, end_ms=end
    )
    return "slept"


@task(takes_context=True)
def block(context: TaskContext[..., Any]) -> str:
    """Blocks for good (until its worker is killed)."""
    _record(context, "block")
    while True:
        time.sleep(0.05)


@task()
def wait_for_file(path: str) -> None:
    """Waits until a file exists at ``path`` (a test's go-ahead), for at most 60 s."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def plain_function(path: str) -> None:
    """Not a Task: a stored path naming it must be refused, and it never called."""
    with open(path, "w") as file:
        file.write("called")


def _hidden(x: int) -> int:
    return x


# A Task that is not stored under its function's name: its path names the
# plain function, so it is refused at enqueue.
hidden_task = task()(_hidden)


@task()
def exits(code: int) -> None:
    """Calls ``sys.exit(code)``: its attempt's error, never the worker's end."""
    sys.exit(code)


@task(backend="retrying", takes_context=True)
def exits_every_attempt(context: TaskContext[..., Any]) -> None:
    """Records each attempt, then calls ``sys.exit()``."""
    _record(context, f"attempt {context.attempt}")
    sys.exit()


@task()
def interrupts() -> None:
    """Raises ``KeyboardInterrupt`` itself (not the worker's signal)."""
    raise KeyboardInterrupt("from the task")


@task(backend="no_losses", takes_context=True)
def block_without_losses(context: TaskContext[..., Any]) -> str:
    """Blocks for good, on a backend whose tasks outlive no lost worker (worker_losses 0)."""
    _record(context, "block")
    while True:
        time.sleep(0.05)


@task(backend="no_losses", takes_context=True)
def note_without_losses(context: TaskContext[..., Any], label: str) -> str:
    """Records that it ran, on a backend whose tasks outlive no lost worker."""
    _record(context, label)
    return label


@task(backend="no_losses", takes_context=True)
def block_first_without_losses(context: TaskContext[..., Any]) -> str:
    """Blocks for good on its first call (until its worker is killed); later calls return."""
    first = not StepCall.objects.filter(run_id=uuid.UUID(context.task_result.id)).exists()
    _record(context, "block")
    while first:
        time.sleep(0.05)
    return "done"


@task(takes_context=True)
def kill_first_worker(context: TaskContext[..., Any]) -> str:
    """SIGKILLs its own worker on its first attempt (retries 0: only the loss budget saves it)."""
    _record(context, f"attempt {context.attempt}")
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


@task(takes_context=True)
def kill_every_worker(context: TaskContext[..., Any]) -> None:
    """SIGKILLs its own worker on every attempt."""
    _record(context, f"attempt {context.attempt}")
    os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True)
def hold_until(context: TaskContext[..., Any], path: str) -> str:
    """Records its attempt; the first waits until ``path`` exists (a worker paused inside it)."""
    _record(context, f"attempt {context.attempt}")
    while context.attempt == 1 and not os.path.exists(path):
        time.sleep(0.02)
    return f"attempt {context.attempt}"


@task()
def counts_up(to: int) -> int:
    """Reports its progress after each number (``pikku_django.tasks.set_progress``)."""
    for i in range(1, to + 1):
        set_progress({"done": i, "of": to})
    return to
