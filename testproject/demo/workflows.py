"""The demo: an order workflow with a flaky step, a slow one and a short durable sleep."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pikku_django.models import WorkflowStep
from pikku_django.workflows import workflow


def charge_card(run_id: str, order_id: int, cents: int) -> dict[str, Any]:
    """Fails its first attempt (a card network timeout), then succeeds."""
    attempt = WorkflowStep.objects.get(run_id=uuid.UUID(run_id), step_name="charge").attempt
    if attempt == 1:
        raise ConnectionError("card network timed out")
    return {"order_id": order_id, "charged": cents, "attempt": attempt}


def pack_parcel(order_id: int) -> dict[str, Any]:
    """Takes a while: its step lease is renewed while it works."""
    time.sleep(1.5)
    return {"parcel": f"P-{order_id:04d}"}


def send_receipt(order_id: int, charge: dict[str, Any], parcel: dict[str, Any]) -> str:
    return f"receipt for order {order_id}: {charge['charged']} cents, parcel {parcel['parcel']}"


@workflow("demo.order")
def order(ctx: Any, input: dict[str, Any]) -> dict[str, Any]:
    order_id = input["order_id"]
    charge = ctx.step(
        "charge", charge_card, str(ctx.run_id), order_id, input["cents"], retries=2, retry_delay=200
    )
    parcel = ctx.step("pack", pack_parcel, order_id, lease_ms=3_000)
    # A durable sleep: the run waits in the database, holding no worker.
    ctx.sleep("cool-off", 500)
    receipt = ctx.step("receipt", send_receipt, order_id, charge, parcel)
    return {"ok": True, "receipt": receipt}
