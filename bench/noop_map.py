"""What bench/fanout.py runs: a no-op Django task, and a workflow mapping a no-op function over items."""

from __future__ import annotations

from typing import Any

from pikku_django.tasks.compat import task
from pikku_django.workflows import workflow


@task()
def noop_task() -> None:
    return None


def noop_item(item: Any) -> Any:
    return item


@workflow("bench.map")
def bench_map(ctx: Any, input: dict[str, Any]) -> int:
    return len(ctx.map("items", noop_item, list(range(input["items"]))))
