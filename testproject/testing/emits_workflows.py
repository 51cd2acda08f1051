"""Workflows that set events and publish to streams, from their code and from their steps."""

from __future__ import annotations

from typing import Any

from pikku_django.workflows import current_step, workflow


@workflow("test.emits")
def emits(ctx: Any, input: dict[str, Any]) -> Any:
    """Publishes ``before`` items and sets ``status``, waits for ``go``, publishes ``after`` more."""
    ctx.set_event("status", {"done": 0})
    offsets = [ctx.publish("log", {"i": i}) for i in range(input.get("before", 3))]
    ctx.set_event("status", {"done": len(offsets)})
    if input.get("wait", True):
        ctx.wait_for_signal("go")
    for i in range(len(offsets), len(offsets) + input.get("after", 2)):
        offsets.append(ctx.publish("log", {"i": i}))
    ctx.set_event("status", {"done": len(offsets)})
    return {"offsets": offsets}


def report_progress(count: int) -> int:
    """A step that publishes ``count`` items and sets ``progress`` from inside its function."""
    step = current_step()
    assert step is not None
    for i in range(count):
        step.publish("log", f"line {i}")
        step.set_event("progress", {"lines": i + 1})
    return count


@workflow("test.step_emits")
def step_emits(ctx: Any, input: dict[str, Any]) -> Any:
    lines = ctx.step("report", report_progress, input.get("count", 3))
    ctx.publish("log", "done")
    return {"lines": lines}


@workflow("test.chunks")
def chunks(ctx: Any, input: dict[str, Any]) -> Any:
    """Per chunk: a step that publishes two lines and sets ``progress``, then an item and ``status``."""
    ctx.set_event("status", {"done": 0})
    for i in range(input.get("chunks", 3)):
        ctx.step(f"chunk-{i}", report_progress, 2)
        ctx.publish("log", {"chunk": i})
        ctx.set_event("status", {"done": i + 1})
    return {"chunks": input.get("chunks", 3)}


@workflow("test.publish_many")
def publish_many(ctx: Any, input: dict[str, Any]) -> Any:
    """``count`` items, each published after a step (so a pass may die between any two)."""
    for i in range(input["count"]):
        if i % input.get("every", 1) == 0:
            ctx.step(f"s{i}", noop_step, i)
        ctx.publish("items", i)
    return {"count": input["count"]}


def noop_step(i: int) -> int:
    return i
