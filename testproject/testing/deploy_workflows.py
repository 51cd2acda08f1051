"""
Two versions of the same workflows, as two deploys would have them: the
version is ``PIKKU_TEST_DEPLOY`` ("v1", the default, or "v2"), read at each
call, so a worker process started with it and a test in this process see
the same code. Every step function records its call (``StepCall``).
"""

from __future__ import annotations

import os
from typing import Any

from pikku_django.workflows import step_function, workflow
from testproject.testing.models import StepCall

#: The environment variable that picks the version of the code.
DEPLOY = "PIKKU_TEST_DEPLOY"


def deployed() -> str:
    return os.environ.get(DEPLOY, "v1")


def _record(run_id: str, step: str) -> None:
    StepCall.objects.create(run_id=run_id, step=step, pid=os.getpid(), at_ms=0)


def tax_v1(run_id: str) -> str:
    _record(run_id, "tax_v1")
    return "tax v1"


def tax_v2(run_id: str) -> str:
    _record(run_id, "tax_v2")
    return "tax v2"


def receipt(run_id: str) -> str:
    _record(run_id, "receipt")
    return "receipt"


@workflow("test.deploy.tax")
def tax(ctx: Any, input: dict[str, Any]) -> Any:
    """v1: the old tax; v2: the new tax behind a patch. Then a sleep or a signal, then a receipt."""
    run_id = str(ctx.run_id)
    if deployed() == "v2" and ctx.patched("tax-v2"):
        taxed = ctx.step("tax", tax_v2, run_id)
    else:
        taxed = ctx.step("tax", tax_v1, run_id)
    if input.get("signal"):
        ctx.wait_for_signal("go")
    else:
        ctx.sleep("cool-off", input.get("sleep_ms", 1))
    return {"tax": taxed, "receipt": ctx.step("receipt", receipt, run_id)}


@workflow("test.deploy.unpatched")
def unpatched(ctx: Any, input: dict[str, Any]) -> Any:
    """v1 holds the patch "tax-v2"; v2 has removed every call of it (too early)."""
    run_id = str(ctx.run_id)
    if deployed() == "v1":
        ctx.patched("tax-v2")
    elif deployed() == "v2-deprecated":
        ctx.deprecate_patch("tax-v2")
    taxed = ctx.step("tax", tax_v2, run_id)
    ctx.sleep("cool-off", input.get("sleep_ms", 1))
    return {"tax": taxed, "receipt": ctx.step("receipt", receipt, run_id)}


def charge_old_home(run_id: str) -> str:
    _record(run_id, "charge")
    return "charged"


def charge_new_home(run_id: str) -> str:
    _record(run_id, "charge")
    return "charged"


@step_function("billing.charge")
def charge_stable_old(run_id: str) -> str:
    _record(run_id, "charge")
    return "charged"


@step_function("billing.charge")
def charge_stable_new(run_id: str) -> str:
    _record(run_id, "charge")
    return "charged"


@workflow("test.deploy.moved")
def moved(ctx: Any, input: dict[str, Any]) -> Any:
    """
    A step function that moves between v1 and v2 (here: another name in the
    module, as a move to another module would give it), with a stable id
    (``input["stable"]``) or without.
    """
    run_id = str(ctx.run_id)
    if input.get("stable"):
        fn = charge_stable_new if deployed() == "v2" else charge_stable_old
    else:
        fn = charge_new_home if deployed() == "v2" else charge_old_home
    charged = ctx.step("charge", fn, run_id)
    ctx.sleep("cool-off", input.get("sleep_ms", 1))
    return {"charge": charged, "receipt": ctx.step("receipt", receipt, run_id)}


def item(value: int) -> int:
    return value * 2


@workflow("test.deploy.items")
def items(ctx: Any, input: dict[str, Any]) -> Any:
    """v1 maps three items, v2 four."""
    ctx.step("first", receipt, str(ctx.run_id))
    values = [1, 2, 3] if deployed() == "v1" else [1, 2, 3, 4]
    return ctx.map("double", item, values)


@workflow("test.deploy.swallows")
def swallows(ctx: Any, input: dict[str, Any]) -> Any:
    """Catches everything its steps raise, a replay error too, and goes on."""
    run_id = str(ctx.run_id)
    fn = charge_new_home if deployed() == "v2" else charge_old_home
    try:
        ctx.step("charge", fn, run_id)
    except Exception as error:
        StepCall.objects.create(
            run_id=run_id, step=f"caught {type(error).__name__}", pid=os.getpid(), at_ms=0
        )
    ctx.sleep("cool-off", input.get("sleep_ms", 1))
    return "done"
