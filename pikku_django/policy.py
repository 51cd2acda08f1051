"""
Policies on steps and tasks: how many attempts, the delay before each
retry (``backoff``), which errors retry (``retry_on``, never a
``NonRetryableError``), and a timeout per attempt (``timeout_ms``).

A backoff is any callable ``(attempt, error) -> ms | None`` (``attempt`` is
the number of the attempt that raised, 1 for the first; None: no more
attempts), or a number of ms; ``exponential()`` and ``fixed()`` make the
usual ones. The delay becomes the run's ``wake_at`` on the database clock.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError, NonRetryableError, StepTimeoutError

logger = logging.getLogger(__name__)

#: A backoff: the delay in ms before the attempt after ``attempt`` (which raised
#: ``error``), or None for no more attempts.
Backoff = Callable[[int, BaseException], int | float | None]

#: The policy options a step or a task takes (``ctx.step(...)``, ``@task(...)``).
POLICY_OPTIONS = frozenset({"max_attempts", "backoff", "retry_on", "timeout_ms", "worker_losses"})

#: Lost workers a step with ``max_attempts`` outlives when ``worker_losses`` is not given.
DEFAULT_WORKER_LOSSES = 2

#: The attribute an error's verdict is kept in (see ``StepPolicy.verdict``).
_JUDGED = "_pikku_verdict"

#: The longest delay before a retry (a step's ``retry_delay`` column).
MAX_DELAY_MS = validate.MAX_INTEGER


def _number(argument: str, value: object, *, minimum: float) -> float:
    """A real number (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{argument} must be a number, not {type(value).__name__}.")
    if not value >= minimum or value == float("inf"):
        raise InvalidArgumentError(f"{argument} must be a finite number >= {minimum}, not {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Exponential:
    """``first_ms * factor ** (attempt - 1)``, capped at ``max_ms``, spread within ±``jitter``."""

    first_ms: int
    factor: float = 2.0
    max_ms: int | None = None
    jitter: float = 0.0

    def __call__(self, attempt: int, error: BaseException | None = None) -> int:
        try:
            delay = self.first_ms * self.factor ** max(attempt - 1, 0)
        except OverflowError:
            delay = float(MAX_DELAY_MS)
        if self.max_ms is not None:
            delay = min(delay, self.max_ms)
        if self.jitter:
            delay *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return int(min(round(delay), MAX_DELAY_MS))


@dataclass(frozen=True)
class Fixed:
    """The same delay before every retry."""

    ms: int

    def __call__(self, attempt: int, error: BaseException | None = None) -> int:
        return self.ms


def exponential(
    first_ms: int, factor: float = 2, max_ms: int | None = None, jitter: float = 0.0
) -> Exponential:
    """
    A backoff whose delay after attempt ``n`` is ``first_ms * factor ** (n - 1)``
    ms, capped at ``max_ms``, then spread uniformly within ±``jitter`` (a
    fraction, 0 to 1) of itself.
    """
    first = validate.whole("first_ms", first_ms, maximum=MAX_DELAY_MS)
    growth = _number("factor", factor, minimum=1)
    cap = None if max_ms is None else validate.whole("max_ms", max_ms, maximum=MAX_DELAY_MS)
    spread = _number("jitter", jitter, minimum=0)
    if spread > 1:
        raise InvalidArgumentError(f"jitter must be a fraction from 0 to 1, not {jitter!r}.")
    return Exponential(first, growth, cap, spread)


def fixed(ms: int) -> Fixed:
    """A backoff of ``ms`` before every retry."""
    return Fixed(validate.whole("ms", ms, maximum=MAX_DELAY_MS))


def _backoff(value: object) -> Backoff | None:
    if value is None or callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"backoff must be a number of ms or a callable (attempt, error) -> ms | None, "
            f"not {type(value).__name__}."
        )
    return fixed(validate.whole("backoff", value, maximum=MAX_DELAY_MS))


def _retry_on(value: object) -> tuple[type[BaseException], ...] | None:
    if value is None:
        return None
    classes = value if isinstance(value, (tuple, list)) else (value,)
    for item in classes:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidArgumentError(
                f"retry_on must be an exception class or a tuple of them, not {item!r}."
            )
    return tuple(classes)


@dataclass(frozen=True)
class Verdict:
    """After an attempt raised: no more attempts (``final``), or the delay in ms before the next."""

    final: bool
    delay: int | None = None


@dataclass
class StepPolicy:
    """The policy options of one step or task, validated (see ``step_policy``)."""

    max_attempts: int | None = None
    worker_losses: int | None = None
    backoff: Backoff | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    timeout_ms: int | None = None

    def budget(self, retries: int | None) -> tuple[int | None, int | None]:
        """(retries, worker_losses) as the step row stores them (``max_attempts`` counts raised attempts)."""
        if self.max_attempts is not None:
            losses = DEFAULT_WORKER_LOSSES if self.worker_losses is None else self.worker_losses
            return self.max_attempts - 1, losses
        return retries, self.worker_losses

    def retries(self, error: BaseException) -> bool:
        """Does ``error`` allow another attempt (``retry_on``; never a ``NonRetryableError``)?"""
        if isinstance(error, NonRetryableError):
            return False
        # A timeout counts against max_attempts, whatever retry_on names.
        return self.retry_on is None or isinstance(error, (*self.retry_on, StepTimeoutError))

    def verdict(self, attempt: int, error: BaseException) -> Verdict:
        """After attempt ``attempt`` raised ``error``: stop, or retry after the backoff's delay."""
        # Kept on the error, so that asked again (a task's last-attempt
        # check, then the record of its failure) a jittered or stateful
        # backoff gives the same answer.
        judged = getattr(error, _JUDGED, None)
        if isinstance(judged, tuple) and judged[0] == attempt:
            return judged[1]  # type: ignore[no-any-return]
        verdict = self._judge(attempt, error)
        with contextlib.suppress(AttributeError, TypeError):
            setattr(error, _JUDGED, (attempt, verdict))
        return verdict

    def _judge(self, attempt: int, error: BaseException) -> Verdict:
        if not self.retries(error):
            return Verdict(final=True)
        if self.backoff is None:
            return Verdict(final=False)
        try:
            delay = self.backoff(attempt, error)
        except Exception:
            logger.exception("The backoff of attempt %s raised; its retry is due at once.", attempt)
            return Verdict(final=False, delay=0)
        if delay is None:
            return Verdict(final=True)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay != delay:
            logger.error(
                "The backoff of attempt %s returned %r, not ms; its retry is due at once.", attempt, delay
            )
            return Verdict(final=False, delay=0)
        return Verdict(final=False, delay=int(min(max(delay, 0), MAX_DELAY_MS)))


def step_policy(
    *,
    retries: int | None = None,
    max_attempts: int | None = None,
    backoff: object = None,
    retry_on: object = None,
    timeout_ms: int | None = None,
    worker_losses: int | None = None,
) -> StepPolicy | None:
    """
    The policy of these options, validated (a ``ValueError`` naming the
    argument), or None when none is given (a step judged exactly as before).
    """
    if max_attempts is not None and retries is not None:
        raise InvalidArgumentError(
            "retries and max_attempts cannot both be given: max_attempts replaces retries."
        )
    policy = StepPolicy(
        max_attempts=None
        if max_attempts is None
        else validate.whole("max_attempts", max_attempts, minimum=1, maximum=validate.MAX_RETRIES),
        worker_losses=None if worker_losses is None else validate.retries("worker_losses", worker_losses),
        backoff=_backoff(backoff),
        retry_on=_retry_on(retry_on),
        timeout_ms=None if timeout_ms is None else validate.positive_ms("timeout_ms", timeout_ms),
    )
    if policy == StepPolicy():
        return None
    return policy


def _path(argument: str, value: Any) -> str:
    """The dotted path ``value`` is imported back by (a stored policy is read by another process)."""
    path = f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    try:
        found = _import(path)
    except (ImportError, AttributeError, ValueError):
        found = None
    if found is not value:
        raise InvalidArgumentError(
            f"{argument} must be importable by its path to be stored (a module-level name), not {value!r}."
        )
    return path


def _import(path: str) -> Any:
    """The object a dotted path names: its longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


def dump_policy(policy: StepPolicy) -> dict[str, Any]:
    """
    ``policy``'s backoff, retry_on and timeout_ms as JSON, stored with a run
    (a task's, a map's item) for the worker that runs it: a callable or an
    exception class by its dotted path (``ValueError`` when it has none).
    """
    stored: dict[str, Any] = {}
    backoff = policy.backoff
    if isinstance(backoff, Exponential):
        stored["backoff"] = {
            "exponential": [backoff.first_ms, backoff.factor, backoff.max_ms, backoff.jitter]
        }
    elif isinstance(backoff, Fixed):
        stored["backoff"] = {"fixed": backoff.ms}
    elif backoff is not None:
        stored["backoff"] = {"path": _path("backoff", backoff)}
    if policy.retry_on is not None:
        stored["retry_on"] = [_path("retry_on", item) for item in policy.retry_on]
    if policy.timeout_ms is not None:
        stored["timeout_ms"] = policy.timeout_ms
    return stored


def load_policy(stored: dict[str, Any]) -> dict[str, Any]:
    """The ``ctx.step`` options of a policy ``dump_policy`` stored."""
    options: dict[str, Any] = {}
    backoff = stored.get("backoff")
    if isinstance(backoff, dict) and "exponential" in backoff:
        options["backoff"] = exponential(*backoff["exponential"])
    elif isinstance(backoff, dict) and "fixed" in backoff:
        options["backoff"] = fixed(backoff["fixed"])
    elif isinstance(backoff, dict):
        options["backoff"] = _import(backoff["path"])
    if "retry_on" in stored:
        options["retry_on"] = tuple(_import(path) for path in stored["retry_on"])
    if stored.get("timeout_ms") is not None:
        options["timeout_ms"] = stored["timeout_ms"]
    return options


def policy_options(options: dict[str, Any]) -> StepPolicy | None:
    """``step_policy`` of the policy options among ``options`` (a task's)."""
    return step_policy(**{name: value for name, value in options.items() if name in POLICY_OPTIONS})


__all__ = [
    "POLICY_OPTIONS",
    "Backoff",
    "Exponential",
    "Fixed",
    "NonRetryableError",
    "StepPolicy",
    "Verdict",
    "dump_policy",
    "exponential",
    "fixed",
    "load_policy",
    "policy_options",
    "step_policy",
]
