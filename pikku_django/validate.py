"""Argument checks that run before any SQL: each error names its argument."""

from __future__ import annotations

import json
from typing import Any

from pikku_django.errors import InvalidArgumentError

#: Keys and holders are varchar(255): longer is refused, never truncated.
MAX_NAME_LENGTH = 255

#: Longest ttl accepted: about 31 years, far inside a bigint of epoch ms.
MAX_TTL_MS = 10**12


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


def whole(argument: str, value: object, *, minimum: int = 0) -> int:
    """A whole number >= ``minimum`` (``True`` is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{argument} must be an int, not {type(value).__name__}.")
    if value < minimum:
        raise InvalidArgumentError(f"{argument} must be >= {minimum}, not {value}.")
    return value


def json_value(argument: str, value: Any) -> Any:
    """A value that survives a JSON round trip unchanged in kind."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{argument} must be JSON-serialisable: {e}") from e
    return value


#: A run's priority is an IntegerField: a signed 32-bit whole number.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1


#: Queue names are at most this long, so a queue's slot lease keys fit in 255.
MAX_QUEUE_LENGTH = 100


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
