"""``async def`` step functions run in their lane, their lease renewed while they await."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.test import TransactionTestCase

from pikku_django.models import Lease, WorkflowStep
from pikku_django.workflows import run_workflow, start_workflow, workflow

CALLS: list[str] = []


async def doubled(value: int) -> int:
    CALLS.append("doubled")
    await asyncio.sleep(0.01)
    return value * 2


def lease_left_ms(run_id: Any) -> int:
    try:
        step = WorkflowStep.objects.get(run_id=run_id, step_name="slow")
        assert step.lease_expires_at is not None
        return step.lease_expires_at - Lease.objects.db_now_ms()
    finally:
        # Read on an executor's thread: its connection is this call's alone.
        connection.close()


async def outlasts_its_lease(run_id: str) -> int:
    # Three times its 300 ms lease: the keeper must renew it meanwhile.
    await asyncio.sleep(0.9)
    return await sync_to_async(lease_left_ms, thread_sensitive=False)(run_id)


@workflow("async.steps")
def async_steps(ctx: Any, input: Any) -> Any:
    value = ctx.step("double", doubled, input)
    left = ctx.step("slow", outlasts_its_lease, str(ctx.run_id), lease_ms=300)
    return {"value": value, "lease_was_live": left > 0}


class AsyncStepTests(TransactionTestCase):
    def test_an_async_step_runs_and_its_result_replays(self) -> None:
        CALLS.clear()
        run = run_workflow(start_workflow("async.steps", 21).pk)
        assert (run.status, run.output) == ("completed", {"value": 42, "lease_was_live": True})
        # A replay returns the stored results without awaiting anything again.
        type(run).objects.filter(pk=run.pk).update(status="running")
        again = run_workflow(run.pk)
        assert again.output == {"value": 42, "lease_was_live": True}
        assert CALLS == ["doubled"]
