"""argparse ``type=`` functions shared by the commands: each refusal names the value."""

from __future__ import annotations

import argparse
import math

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError

#: The longest wait an --interval may ask for: a day.
MAX_INTERVAL_SECONDS = 86_400.0

#: The longest duration in seconds any option takes (validate.MAX_TTL_MS).
MAX_SECONDS = validate.MAX_TTL_MS / 1000


def seconds(value: str) -> float:
    """A finite number of seconds >= 0."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or not 0 <= number <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value!r} must be between 0 and {MAX_SECONDS:.0f} seconds")
    return number


def interval(value: str) -> float:
    """A number of seconds > 0 and at most a day."""
    number = seconds(value)
    if not 0 < number <= MAX_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} must be > 0 and at most {MAX_INTERVAL_SECONDS:.0f} seconds"
        )
    return number


def positive_int(value: str) -> int:
    """A whole number >= 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be >= 1")
    return number


def holder_name(value: str) -> str:
    """A lease holder's name: 1 to 255 characters."""
    try:
        return validate.name("holder", value)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def queue_names(value: str) -> list[str]:
    """One or more queue names, comma-separated (``--queue a,b``)."""
    names = [part.strip() for part in value.split(",")]
    try:
        return [validate.queue_name("queue", name) for name in names]
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e}") from None
