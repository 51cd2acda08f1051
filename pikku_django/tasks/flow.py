"""
Flow control through a task's options (docs/flow-control.md): ``key``,
``dedup_key``, ``dedup``, ``debounce_ms``, ``debounce_max_ms`` and
``debounce_mode``, each as ``start_workflow`` takes it. ``key`` and
``dedup_key`` may be format strings filled from the call's keyword
arguments (``key="user:{user_id}"``) or callables of ``(args, kwargs)``, so
each call gets its own key.

A debounced task in ``"collect"`` mode is called once per burst with one
argument: the list of every call's ``{"args": [...], "kwargs": {...}}``, in
order (``collect_call``, ``fold_calls``).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable, Mapping
from typing import Any

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError
from pikku_django.validate import DEBOUNCE_MODES, DEDUP_MODES

#: The options whose value is a key: a string, a format string or a callable.
KEY_OPTIONS = ("key", "dedup_key")


def check_flow_options(options: Mapping[str, Any], *, together: bool = True) -> None:
    """
    A task's flow-control options, refused when it is made, each error
    naming its option; ``together``: those that need one another too
    (``debounce_ms`` a ``key``, ...), once the task has all its options.
    """
    for name in KEY_OPTIONS:
        value = options.get(name)
        if value is None or callable(value):
            continue
        validate.name(name, value)
        _fields(name, value)
    if options.get("dedup", "return") not in DEDUP_MODES:
        raise InvalidArgumentError(f"dedup must be one of {DEDUP_MODES}, not {options['dedup']!r}.")
    mode = options.get("debounce_mode", "last")
    if mode not in DEBOUNCE_MODES:
        raise InvalidArgumentError(f"debounce_mode must be one of {DEBOUNCE_MODES}, not {mode!r}.")
    for name in ("debounce_ms", "debounce_max_ms"):
        if options.get(name) is not None:
            validate.positive_ms(name, options[name])
    if together:
        _check_together(options)


def _check_together(options: Mapping[str, Any]) -> None:
    """The flow options that need one another (``check_flow_options``)."""
    if options.get("debounce_max_ms") is not None and options.get("debounce_ms") is None:
        raise InvalidArgumentError("debounce_max_ms needs debounce_ms.")
    if options.get("debounce_ms") is not None:
        if options.get("key") is None:
            raise InvalidArgumentError("debounce_ms needs a key: the calls of one key make one run.")
        if options.get("dedup_key") is not None:
            raise InvalidArgumentError("debounce_ms cannot be combined with dedup_key.")


def _fields(name: str, template: str) -> list[str]:
    """The keyword arguments the format string ``template`` names; a bad one refused naming ``name``."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise InvalidArgumentError(f"{name} {template!r} is not a valid format string: {e}.") from None
    fields = [field for _, field, _, _ in parsed if field is not None]
    for field in fields:
        if not field or field[0].isdigit():
            raise InvalidArgumentError(
                f"{name} {template!r} may name only keyword arguments ({{user_id}}), not {{{field}}}."
            )
    return fields


def flow_arguments(
    options: Mapping[str, Any], args: list[Any], kwargs: dict[str, Any], path: str
) -> dict[str, Any]:
    """
    The flow-control arguments of one call of the task at ``path``
    (``start_workflow``'s names), its keys filled from ``args`` and
    ``kwargs``; its ``dedup_key`` is the task's own (``task_dedup_key``). A format string that names a
    keyword argument the call lacks, or a callable that raises or returns
    anything but a non-empty string, raises ``InvalidArgumentError`` naming
    the option.
    """
    given: dict[str, Any] = {}
    for name in KEY_OPTIONS:
        if options.get(name) is not None:
            given[name] = _key(name, options[name], args, kwargs)
    if "dedup_key" in given:
        given["dedup_key"] = task_dedup_key(path, given["dedup_key"])
    for name in ("dedup", "debounce_ms", "debounce_max_ms", "debounce_mode"):
        if name in options:
            given[name] = options[name]
    return given


def task_dedup_key(path: str, dedup_key: str) -> str:
    """
    The dedup key a task's run is stored with: ``<task path>:<dedup_key>``,
    as every task is a run of one workflow (a digest of it when that is
    longer than 255 characters).
    """
    scoped = f"{path}:{dedup_key}"
    if len(scoped) <= validate.MAX_NAME_LENGTH:
        return scoped
    return f"{path[:120]}:sha256:{hashlib.sha256(scoped.encode()).hexdigest()}"


def _key(name: str, value: str | Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> str:
    """One call's ``key`` or ``dedup_key`` from the option ``value``."""
    if callable(value):
        try:
            made = value(tuple(args), dict(kwargs))
        except Exception as e:
            raise InvalidArgumentError(f"the task option {name}'s callable raised {e!r}.") from e
        return validate.name(name, made)
    missing = [field for field in _fields(name, value) if field.split(".")[0].split("[")[0] not in kwargs]
    if missing:
        raise InvalidArgumentError(
            f"the task option {name}={value!r} names {missing[0]!r}, which this call's keyword "
            f"arguments lack (given: {sorted(kwargs)}); pass it by keyword."
        )
    try:
        return validate.name(name, value.format_map(kwargs))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
        raise InvalidArgumentError(f"the task option {name}={value!r} could not be filled: {e!r}.") from e


def collect_call(args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One call as a debounced task in ``"collect"`` mode receives it."""
    return {"args": args, "kwargs": kwargs}


def fold_calls(open_input: Any, stored: dict[str, Any]) -> dict[str, Any]:
    """
    The input of a ``"collect"`` task's run with the call ``stored`` joined:
    its one argument, the list of calls, grown by this one (``stored`` as
    ``enqueue`` built it, holding only this call); or ``stored`` itself for
    the burst's first call.
    """
    if not isinstance(open_input, dict) or not open_input.get("args"):
        return stored
    return {**stored, "args": [[*open_input["args"][0], *stored["args"][0]]]}
