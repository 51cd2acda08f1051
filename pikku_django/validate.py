"""Argument checks that run before any SQL: each error names its argument."""

from __future__ import annotations

import json
from typing import Any, Literal

from pikku_django.conf import conf
from pikku_django.errors import InvalidArgumentError

#: Keys and holders are varchar(255): longer is refused, never truncated.
MAX_NAME_LENGTH = 255

#: Longest ttl accepted: about 31 years, far inside a bigint of epoch ms.
MAX_TTL_MS = 10**12

#: The largest value a BigIntegerField (epoch ms, tokens) holds.
MAX_BIGINT = 2**63 - 1


def name(argument: str, value: object) -> str:
    """A non-empty string of at most 255 characters."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{argument} must be a str, not {type(value).__name__}.")
    if not value:
        raise InvalidArgumentError(f"{argument} must not be empty.")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgumentError(
            f"{argument} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed."
        )
    if "\x00" in value:
        raise InvalidArgumentError(f"{argument} must not contain NUL characters.")
    return value


def positive_ms(argument: str, value: object) -> int:
    """A whole number of milliseconds, > 0 (``True`` is not a duration)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{argument} must be an int number of milliseconds, not {type(value).__name__}."
        )
    if value <= 0:
        raise InvalidArgumentError(f"{argument} must be > 0 milliseconds, not {value}.")
    if value > MAX_TTL_MS:
        raise InvalidArgumentError(f"{argument} must be at most {MAX_TTL_MS} milliseconds, not {value}.")
    return value


def whole(argument: str, value: object, *, minimum: int = 0, maximum: int = MAX_BIGINT) -> int:
    """A whole number from ``minimum`` to ``maximum`` (``True`` is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{argument} must be an int, not {type(value).__name__}.")
    if value < minimum:
        raise InvalidArgumentError(f"{argument} must be >= {minimum}, not {value}.")
    if value > maximum:
        raise InvalidArgumentError(f"{argument} must be at most {maximum}, not {value}.")
    return value


#: A step's ``retries`` and ``retry_delay`` are PositiveIntegerFields (signed
#: 32-bit columns); ``attempt``, which reaches ``retries + 1``, is one too.
MAX_INTEGER = 2**31 - 1
MAX_RETRIES = MAX_INTEGER - 1


def retries(argument: str, value: object) -> int:
    """A step's retries (attempts after the first): 0 to ``MAX_RETRIES``."""
    return whole(argument, value, maximum=MAX_RETRIES)


def retry_delay(argument: str, value: object) -> int:
    """A step's delay before a retry, in milliseconds: 0 to ``MAX_INTEGER``."""
    return whole(argument, value, maximum=MAX_INTEGER)


def json_text(
    argument: str, value: Any, *, not_json: type[InvalidArgumentError] = InvalidArgumentError
) -> str:
    """
    ``value`` as the JSON text stored for it, refused (naming ``argument``)
    unless a JSON round trip keeps it, it holds no NUL character or lone
    surrogate in any string or key (PostgreSQL's jsonb cannot store them),
    and it is at most ``PIKKU_MAX_JSON_BYTES`` long. A value that is not JSON
    raises ``not_json``.
    """
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise not_json(f"{argument} must be JSON-serialisable: {e}") from e
    limit = conf.MAX_JSON_BYTES
    # ASCII (json.dumps escapes the rest), so its length is its size in bytes.
    if len(text) > limit:
        raise InvalidArgumentError(
            f"{argument} is {len(text)} bytes of JSON; at most {limit} are stored "
            "(PIKKU_MAX_JSON_BYTES). Store large data elsewhere and pass a reference to it."
        )
    # Escapes are only a hint (a string may hold a backslash and 'u0000'):
    # the walk decides, and runs only when one is there.
    if ("\\u0000" in text or "\\ud" in text) and (bad := _unstorable(value)) is not None:
        raise InvalidArgumentError(f"{argument} must not hold {bad} in any string or key.")
    return text


def _unstorable(value: Any) -> str | None:
    """What in ``value`` no database stores in JSON (a NUL, a lone surrogate), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a NUL character"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "a lone surrogate"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def json_value(
    argument: str, value: Any, *, not_json: type[InvalidArgumentError] = InvalidArgumentError
) -> Any:
    """A value that survives a JSON round trip unchanged in kind and can be stored (see ``json_text``)."""
    json_text(argument, value, not_json=not_json)
    return value


#: A run's priority is an IntegerField: a signed 32-bit whole number.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1


#: Queue names are at most this long, so a queue's slot lease keys fit in 255.
MAX_QUEUE_LENGTH = 100

#: What a start does when its dedup key is taken: return that run, or raise.
DedupMode = Literal["return", "raise"]
DEDUP_MODES: tuple[DedupMode, ...] = ("return", "raise")

#: What a debounced run's input is: the last start's, or every start's in order.
DebounceMode = Literal["last", "collect"]
DEBOUNCE_MODES: tuple[DebounceMode, ...] = ("last", "collect")


def queue_name(argument: str, value: object) -> str:
    """A queue's name: a non-empty string of at most 100 characters."""
    value = name(argument, value)
    if len(value) > MAX_QUEUE_LENGTH:
        raise InvalidArgumentError(
            f"{argument} is {len(value)} characters long; at most {MAX_QUEUE_LENGTH} are allowed."
        )
    return value


def priority(argument: str, value: object) -> int:
    """A whole number a run's priority column holds (higher runs first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{argument} must be an int, not {type(value).__name__}.")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgumentError(
            f"{argument} must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {value}."
        )
    return value
