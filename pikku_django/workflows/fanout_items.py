"""
What a fan-out is made of, apart from its step: the function a ``ctx.map``
calls (found by its import path on any worker) and the internal workflow each
item runs; the bound on an item's result; the items' keys; and whether a
replay's call fits the fan-out as stored.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from pikku_django import validate
from pikku_django.conf import conf
from pikku_django.errors import FanOutReplayError, InvalidArgumentError, StepFunctionMismatchError
from pikku_django.policy import load_policy
from pikku_django.workflows.registry import workflow

#: The internal workflow each item of a ``ctx.map`` runs: one step, ``fn(item)``.
MAP_ITEM_WORKFLOW = "pikku_django.map_item"


def function_path(argument: str, fn: object) -> str:
    """
    ``module:qualname`` of ``fn``, which any worker imports to call it;
    refused unless importing that path gives back ``fn`` (a lambda, a nested
    function or a bound method cannot be found that way).
    """
    if not callable(fn):
        raise InvalidArgumentError(f"{argument} must be callable, not {type(fn).__name__}.")
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        try:
            if import_function(f"{module}:{qualname}") is fn:
                return f"{module}:{qualname}"
        except (ImportError, AttributeError):
            pass
    raise InvalidArgumentError(
        f"{argument}: {fn!r} cannot be imported by its name, so another worker could not call it; "
        "pass a function defined at the top level of a module."
    )


def import_function(path: str) -> Callable[..., Any]:
    """The function at ``module:qualname``."""
    module, _, qualname = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def item_result_bound(count: int) -> int:
    """
    The most bytes of JSON one item's result may take so that the list of
    a map's ``count`` results fits ``PIKKU_MAX_JSON_BYTES``: its share of
    the limit, less the two bytes of the ", " that follows it in the list.
    """
    return conf.MAX_JSON_BYTES // count - 2


@workflow(MAP_ITEM_WORKFLOW, internal=True)
def map_item(ctx: Any, input: dict[str, Any]) -> Any:
    """
    One item of a ``ctx.map``: its function called on it, as a step of this
    run, whose result is bounded by its share of ``PIKKU_MAX_JSON_BYTES``
    (``item_result_bound``, judged by the limit as it is when the item runs).
    """
    count = input.get("of")
    if count:
        bound = item_result_bound(int(count))
        ctx.result_bound = (
            bound,
            f"an item of a map of {count} items stores at most {bound} bytes, its share of "
            f"PIKKU_MAX_JSON_BYTES ({conf.MAX_JSON_BYTES}), so that the list of their results can be stored",
        )
    fn = import_function(input["fn"])
    options = dict(input.get("options", {}))
    # The map's policy as stored (backoff and retry_on by their paths).
    options.update(load_policy(options.pop("policy", {})))
    return ctx.step(input["step"], fn, input["item"], **options)


def json_list(argument: str, values: object) -> list[Any]:
    if not isinstance(values, (list, tuple)):
        raise InvalidArgumentError(f"{argument} must be a list of JSON values, not {type(values).__name__}.")
    return [validate.json_value(f"{argument}[{index}]", value) for index, value in enumerate(values)]


def results_fit(count: int) -> None:
    """Refuse a map of ``count`` items whose list of results could not be stored, were each ``null``."""
    if count and item_result_bound(count) < len("null"):
        raise InvalidArgumentError(
            f"items: the results of {count} items cannot be stored as one list within "
            f"PIKKU_MAX_JSON_BYTES ({conf.MAX_JSON_BYTES}), at most {item_result_bound(count)} bytes each; "
            "map fewer items per step, or raise the limit."
        )


def checked_max_parallel(value: object) -> int | None:
    if value is None:
        return None
    return validate.whole("max_parallel", value, minimum=1, maximum=validate.MAX_INTEGER)


#: A fan-out's ``key``: one key for every child, or a function of each item (or input).
ItemKey = str | Callable[[Any], str] | None


def item_keys(key: ItemKey, values: list[Any]) -> list[str | None] | None:
    """
    Each child's flow-control key (docs/flow-control.md): ``key`` itself, or
    ``key(value)`` per item; None without one. Refused naming the item.
    """
    if key is None:
        return None
    if not callable(key):
        return [validate.name("key", key)] * len(values)
    return [validate.name(f"key of item {index}", key(value)) for index, value in enumerate(values)]


def values_digest(values: Sequence[Any]) -> str:
    text = json.dumps(list(values), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def fan_out_fits(
    run_id: Any, name: str, stored: dict[str, Any], target: dict[str, str], values: list[Any], argument: str
) -> None:
    """
    A fan-out step as stored (``stored``, its data) fits this replay's call:
    the same function or workflow (``target``), and the same list of items.
    Else ``StepFunctionMismatchError`` or ``FanOutReplayError``.
    """
    for key, value in target.items():
        if stored.get(key) != value:
            raise StepFunctionMismatchError(run_id, name, str(stored.get(key)), value)
    if stored.get("count") != len(values) or stored.get("digest") != values_digest(values):
        raise FanOutReplayError(run_id, name, argument, stored.get("count"), len(values))
