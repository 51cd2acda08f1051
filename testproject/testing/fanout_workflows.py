"""Workflows that fan out (ctx.map, ctx.workflows), for the fan-out tests."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from pikku_django.errors import StepFailedError
from pikku_django.workflows import current_step, workflow
from testproject.testing.models import StepCall


def record_item(item: dict[str, Any]) -> int:
    """
    An item of a map: records its start and end (``StepCall`` ``start:<i>`` and
    ``end:<i>``, under the item's own run), then returns ``i * 10``. It waits
    ``ms`` first, then until the items ``after_starts`` have started; ``fail``
    raises; ``kill`` SIGKILLs its worker on the first
    call when the file ``kill`` names does not exist yet (and creates it).
    """
    handle = current_step()
    assert handle is not None
    index = item["i"]
    StepCall.objects.create(run_id=handle.run_id, step=f"start:{index}", pid=os.getpid(), at_ms=_now())
    kill_once(item.get("kill"))
    if item.get("ms"):
        time.sleep(item["ms"] / 1000)
    _wait_for_starts(item.get("after_starts", []))
    if item.get("fail") or (item.get("fail_unless") and not os.path.exists(item["fail_unless"])):
        raise ValueError(f"item {index} fails")
    StepCall.objects.create(run_id=handle.run_id, step=f"end:{index}", pid=os.getpid(), at_ms=_now())
    return int(index) * 10


def _wait_for_starts(indexes: list[int], timeout: float = 30) -> None:
    """Return once the items ``indexes`` have started (their ``start:`` records), or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    names = [f"start:{index}" for index in indexes]
    while StepCall.objects.filter(step__in=names).count() < len(names) and time.monotonic() < deadline:
        time.sleep(0.01)


def kill_once(marker: str | None) -> None:
    """SIGKILL this process, unless ``marker`` is None or the file it names exists (then create it first)."""
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def _now() -> int:
    from pikku_django.models import Lease

    return Lease.objects.db_now_ms()


@workflow("test.map")
def mapper(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.map`` over ``input["items"]`` with ``input["options"]``; then one more step, once."""
    try:
        results = ctx.map("items", record_item, input["items"], **input.get("options", {}))
    except StepFailedError as error:
        return {"failed": error.error.get("message"), "item": error.error.get("item")}
    total = ctx.step("sum", _total, results)
    return {"results": results, "sum": total}


@workflow("test.map_strict")
def map_strict(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.map`` whose failure fails the run (for retry_workflow)."""
    return ctx.map("items", record_item, input["items"], **input.get("options", {}))


def _total(results: list[int]) -> int:
    return sum(results)


def child_step(input: dict[str, Any]) -> Any:
    """A child's one step: records itself, waits ``ms``, fails when told, kills once (as ``record_item``)."""
    handle = current_step()
    assert handle is not None
    StepCall.objects.create(run_id=handle.run_id, step="child", pid=os.getpid(), at_ms=_now())
    kill_once(input.get("kill"))
    if input.get("ms"):
        time.sleep(input["ms"] / 1000)
    if input.get("fail"):
        raise RuntimeError(f"child {input['i']} fails")
    return {"shipped": input["i"]}


@workflow("test.fan_child")
def fan_child(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.step("ship", child_step, input)


@workflow("test.fan_parent")
def fan_parent(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.workflows`` over ``input["inputs"]`` of ``test.fan_child``."""
    try:
        outputs = ctx.workflows(
            "ship", "test.fan_child", input["inputs"], max_parallel=input.get("max_parallel")
        )
    except StepFailedError as error:
        return {"failed": error.error.get("message")}
    return {"outputs": outputs}


def add_one(value: int) -> int:
    return value + 1


@workflow("test.fan_mix")
def fan_mix(ctx: Any, input: dict[str, Any]) -> Any:
    """
    Every kind of fan-out and wait in one run: ``ctx.map`` of ``input["n"]``
    items (each retried never, as every item is), a child run, a short
    sleep, a second map ``input["max_parallel"]`` at a time, a last step.
    """
    first = ctx.map("first", add_one, list(range(input["n"])))
    child = ctx.workflow("child", "test.double", sum(first))
    ctx.sleep("nap", input.get("nap_ms", 20))
    second = ctx.map("second", add_one, first, max_parallel=input.get("max_parallel"))
    return {"child": child, "sum": ctx.step("sum", _total, second)}


def tenant_key(item: dict[str, Any]) -> str:
    """The flow-control key of an item of ``test.keyed_map``: its tenant's."""
    return f"tenant:{item['tenant']}"


def item_number(item: dict[str, Any]) -> int:
    return int(item["n"])


@workflow("test.keyed_map")
def keyed_map(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.map`` over ``input["items"]`` (``{"tenant", "n"}``), each item run under its tenant's key."""
    return ctx.map("items", item_number, input["items"], key=tenant_key)


@workflow("test.keyed_children")
def keyed_children(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.workflows`` of ``test.echo_input`` over ``input["inputs"]``, each under its tenant's key."""
    inputs = input["inputs"]
    return ctx.workflows("kids", "test.echo_input", inputs, key=lambda each: f"tenant:{each['tenant']}")


@workflow("test.signal_children")
def signal_children(ctx: Any, input: dict[str, Any]) -> Any:
    """``input["n"]`` children of ``test.signals``, one at a time: each waits for its signal "go"."""
    return ctx.workflows("kids", "test.signals", [{"name": "go", "waits": 1}] * input["n"], max_parallel=1)


def padded(item: dict[str, Any]) -> str:
    """An item's result of ``item["n"]`` characters (``n + 2`` bytes of JSON)."""
    return "x" * int(item["n"])


@workflow("test.map_padded")
def map_padded(ctx: Any, input: dict[str, Any]) -> Any:
    """``ctx.map`` of ``padded`` over ``input["items"]``, never retried; its failure fails the run."""
    return ctx.map("items", padded, input["items"], retries=0, max_parallel=input.get("max_parallel"))
