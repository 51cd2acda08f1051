"""Workflows the tests drive in-process and through worker processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pikku_django.errors import SignalTimeoutError, StepFailedError
from pikku_django.models import Lease
from pikku_django.workflows import current_step, workflow
from testproject.testing.models import PassRecord, StepCall


def record_call(run_id: str, step: str) -> int:
    """Count one call of a step body; returns how many calls came before it."""
    before = StepCall.objects.filter(run_id=run_id, step=step).count()
    StepCall.objects.create(run_id=run_id, step=step, pid=os.getpid(), at_ms=Lease.objects.db_now_ms())
    return before


@contextmanager
def recorded_pass(run_id: Any) -> Iterator[None]:
    start = Lease.objects.db_now_ms()
    try:
        yield
    finally:
        end = Lease.objects.db_now_ms()
        PassRecord.objects.create(run_id=run_id, pid=os.getpid(), start_ms=start, end_ms=end)


def plain_step(run_id: str, name: str) -> str:
    record_call(run_id, name)
    return f"{name} done"


@workflow("test.steps")
def steps(ctx: Any, input: dict[str, Any]) -> list[str]:
    """``input["steps"]`` trivial steps, each counted; passes recorded."""
    with recorded_pass(ctx.run_id):
        return [ctx.step(f"s{i}", plain_step, str(ctx.run_id), f"s{i}") for i in range(input.get("steps", 5))]


def block_first_call(run_id: str) -> dict[str, int]:
    """Blocks for good on its first call (until its worker is killed)."""
    before = record_call(run_id, "block")
    if before == 0:
        while True:
            time.sleep(0.05)
    return {"call": before + 1}


@workflow("test.blocker")
def blocker(ctx: Any, input: dict[str, Any]) -> Any:
    first = ctx.step("block", block_first_call, str(ctx.run_id), lease_ms=input["lease_ms"], retries=2)
    return {"block": first}


@workflow("test.thinks_between_steps")
def thinks_between_steps(ctx: Any, input: dict[str, Any]) -> Any:
    """Step "a", then ``think_s`` seconds of the workflow's own code, then step "b"."""
    first = ctx.step("a", record_call, str(ctx.run_id), "a")
    time.sleep(input["think_s"])
    second = ctx.step("b", record_call, str(ctx.run_id), "b")
    return {"a": first, "b": second}


def kill_my_worker(run_id: str) -> None:
    record_call(run_id, "kill")
    os.kill(os.getpid(), signal.SIGKILL)


@workflow("test.killer")
def killer(ctx: Any, input: dict[str, Any]) -> Any:
    ctx.step("kill", kill_my_worker, str(ctx.run_id), lease_ms=input["lease_ms"], retries=1)
    return "unreachable"


def fail_first_call(run_id: str) -> str:
    """Fails on its first call (counted); every later call succeeds."""
    if record_call(run_id, "flaky") == 0:
        raise RuntimeError("the first call fails")
    return "retried"


@workflow("test.retry_later")
def retry_later(ctx: Any, input: dict[str, Any]) -> Any:
    """One step that fails once and is retried after ``input["delay_ms"]``."""
    return ctx.step("flaky", fail_first_call, str(ctx.run_id), retries=1, retry_delay=input["delay_ms"])


def wait_for_release(run_id: str, path: str) -> str:
    """Says it started (a StepCall row), then waits for ``path`` to exist."""
    record_call(run_id, "hold")
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "released"


@workflow("test.hold_then_more")
def hold_then_more(ctx: Any, input: dict[str, Any]) -> Any:
    held = ctx.step("hold", wait_for_release, str(ctx.run_id), input["path"])
    after = ctx.step("after", plain_step, str(ctx.run_id), "after")
    return [held, after]


def slow_step(run_id: str, name: str, ms: int) -> str:
    """A plain step that takes ``ms`` milliseconds."""
    record_call(run_id, name)
    time.sleep(ms / 1000)
    return f"{name} done"


@workflow("test.slow_steps")
def slow_steps(ctx: Any, input: dict[str, Any]) -> list[str]:
    """``input["steps"]`` steps of ``input["ms"]`` ms each: a backlog that lasts a few seconds."""
    ms = input["ms"]
    return [ctx.step(f"s{i}", slow_step, str(ctx.run_id), f"s{i}", ms) for i in range(input["steps"])]


# -- sleep, signals, child runs, cancel ------------------------------------------


@workflow("test.sleeper")
def sleeper(ctx: Any, input: dict[str, Any]) -> Any:
    """A counted step, a durable sleep of ``input["ms"]``, another counted step."""
    before = ctx.step("before", plain_step, str(ctx.run_id), "before")
    ctx.sleep("nap", input["ms"])
    after = ctx.step("after", plain_step, str(ctx.run_id), "after")
    return [before, after]


@workflow("test.signals")
def signals(ctx: Any, input: dict[str, Any]) -> Any:
    """Waits ``input["waits"]`` times for the signal ``input["name"]`` (one "go"); returns every payload."""
    input = input or {"name": "go", "waits": 1}
    timeout = input.get("timeout_ms")
    return [ctx.wait_for_signal(input["name"], timeout_ms=timeout) for _ in range(input["waits"])]


@workflow("test.signal_or_timeout")
def signal_or_timeout(ctx: Any, input: dict[str, Any]) -> Any:
    """Waits for "approval"; a timeout is caught and the run goes on to a step."""
    try:
        answer = ctx.wait_for_signal("approval", timeout_ms=input["timeout_ms"])
    except SignalTimeoutError:
        answer = "timed out"
    after = ctx.step("after", plain_step, str(ctx.run_id), "after")
    return {"answer": answer, "after": after}


def times_two(value: int) -> int:
    return value * 2


@workflow("test.double")
def double(ctx: Any, input: int) -> Any:
    return ctx.step("double", times_two, input)


@workflow("test.keyed_parent")
def keyed_parent(ctx: Any, input: dict[str, Any]) -> Any:
    """A child run of ``test.double`` under the flow-control key ``input["key"]``."""
    return ctx.workflow("child", "test.double", input["value"], key=input["key"])


@workflow("test.echo_input")
def echo_input(ctx: Any, input: Any) -> Any:
    """Returns its input: what a debounced run was given."""
    return input


@workflow("test.fails")
def fails(ctx: Any, input: Any) -> Any:
    raise RuntimeError("the child gave up")


@workflow("test.parent")
def parent(ctx: Any, input: dict[str, Any]) -> Any:
    """Runs ``input["child"]`` as a child; a failed child is caught and reported."""
    try:
        output = ctx.workflow("child", input["child"], input.get("child_input"))
    except StepFailedError as error:
        return {"child_failed": error.error.get("message")}
    return {"child": output}


def watch_for_cancel(run_id: str, path: str) -> str:
    """Says it started, notices its run's cancellation, then returns once ``path`` exists."""
    record_call(run_id, "hold")
    handle = current_step()
    assert handle is not None
    if handle.cancelled.wait(60):
        record_call(run_id, "noticed")
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "late result"


@workflow("test.cancellable")
def cancellable(ctx: Any, input: dict[str, Any]) -> Any:
    held = ctx.step("hold", watch_for_cancel, str(ctx.run_id), input["path"], lease_ms=input["lease_ms"])
    after = ctx.step("after", plain_step, str(ctx.run_id), "after")
    return [held, after]


def no_io_step(i: int) -> int:
    """A step body that does no I/O: what the runtime alone costs."""
    return i


@workflow("test.noop")
def noop(ctx: Any, input: dict[str, Any]) -> int:
    """``input["steps"]`` steps whose bodies do no I/O (the throughput benchmark's workflow)."""
    return sum(ctx.step(f"s{i}", no_io_step, i) for i in range(input.get("steps", 10)))


def echo_or_raise(value: Any, raise_it: bool, repeat: int, nul: bool) -> Any:
    """``value`` ``repeat`` times, a NUL after it with ``nul``: returned, or raised as a ValueError."""
    value = value * repeat + ("\x00" if nul else "")
    if raise_it:
        raise ValueError(value)
    return value


@workflow("test.values")
def values(ctx: Any, input: dict[str, Any]) -> Any:
    """
    One step that returns (or raises with) ``input["value"]`` made in the
    step (see ``echo_or_raise``); the run's output is the step's result, or
    ``input["output"]`` repeated ``input["output_repeat"]`` times (then a
    NUL with ``input["output_nul"]``).
    """
    args = (input["value"], input.get("raise", False), input.get("repeat", 1), input.get("nul", False))
    step = ctx.step("echo", echo_or_raise, *args, retries=0)
    if "output" in input:
        return input["output"] * input.get("output_repeat", 1) + ("\x00" if input.get("output_nul") else "")
    return step


# -- retry and fork -----------------------------------------------------------------


def fail_until_exists(run_id: str, path: str) -> str:
    """A counted step that raises until ``path`` exists (the bug fixed, the provider back)."""
    record_call(run_id, "fragile")
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing")
    return "fixed"


@workflow("test.fragile")
def fragile(ctx: Any, input: dict[str, Any]) -> Any:
    """A counted step, then one that fails until ``input["path"]`` exists (``retries=1``)."""
    before = ctx.step("before", plain_step, str(ctx.run_id), "before")
    fixed = ctx.step("fragile", fail_until_exists, str(ctx.run_id), input["path"], retries=1)
    return [before, fixed]


@workflow("test.fragile_parent")
def fragile_parent(ctx: Any, input: dict[str, Any]) -> Any:
    """Runs ``test.fragile`` as a child; its failure fails this run too."""
    return ctx.workflow("child", "test.fragile", input)


@workflow("test.scheduled")
def scheduled(ctx: Any, input: Any) -> Any:
    """Returns the instant of the schedule tick that started it (``ctx.scheduled_at``)."""
    at = ctx.scheduled_at
    return {"scheduled_at": None if at is None else at.isoformat(), "input": input}


@workflow("test.catches_around")
def catches_around(ctx: Any, input: dict[str, Any]) -> Any:
    """
    Catches ``Exception`` around a step, as workflows written for
    ``StepFailedError`` do; its except branch waits for ``input["back"]``
    (the database is up again) before it takes the "not charged" branch.
    """
    try:
        ctx.step("charge", wait_for_release, str(ctx.run_id), input["release"], retries=1)
    except Exception:
        deadline = time.monotonic() + 60
        while not os.path.exists(input["back"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        return "not charged"
    return "charged"


# The fan-out, safe-deploy and emit tests' workflows live apart; importing them registers them.
from testproject.testing import deploy_workflows as deploy_workflows  # noqa: E402
from testproject.testing import emits_workflows as emits_workflows  # noqa: E402
from testproject.testing import fanout_workflows as fanout_workflows  # noqa: E402
