"""The PIKKU_* settings, read lazily over their defaults (so override_settings works)."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

#: Every setting with its default; ``checks.py`` type-checks each one.
DEFAULTS: dict[str, int] = {
    # How long hold_lease() holds a lease between renewals.
    "PIKKU_LEASE_TTL_MS": 30_000,
    # How long a claimed workflow step is held before another worker may take it: renewed
    # every third while its function runs, so a killed worker's step is taken again
    # within this plus a sweep interval, however long the step may run.
    "PIKKU_STEP_LEASE_MS": 8_000,
    # Retries of a step after its first attempt (so attempts = retries + 1).
    "PIKKU_STEP_RETRIES": 5,
    # How long a running run may sit idle before the sweep wakes it.
    "PIKKU_STALLED_AFTER_MS": 300_000,
    # How long a pending step may wait undispatched before the sweep wakes its run.
    "PIKKU_UNDISPATCHED_AFTER_MS": 30_000,
    # How long a lapsed lease row is kept before the sweep prunes it.
    "PIKKU_LEASE_PRUNE_AFTER_MS": 7 * 24 * 3600 * 1000,
    # The largest JSON value (input, payload, step result, output, task args) stored, in bytes.
    "PIKKU_MAX_JSON_BYTES": 2 * 1024 * 1024,
    # How long past an attempt's timeout its lane waits for the function to end before leaving it.
    "PIKKU_TIMEOUT_GRACE_MS": 5_000,
    # Threads of timed-out attempts that ignored it a worker keeps running before it stops.
    "PIKKU_TIMEOUT_MAX_ABANDONED": 8,
    # A pass at most this short lets its lane's next take take several due runs at once (0: never).
    "PIKKU_TAKE_AHEAD_BELOW_MS": 5,
}

_DAY_MS = 24 * 3600 * 1000

#: How long a finished run is kept, by status, in ms (``None`` keeps it for
#: ever): PIKKU_RETENTION_MS overrides these per status, and a status it
#: leaves out keeps its default.
RETENTION_DEFAULTS: dict[str, int | None] = {
    "completed": 7 * _DAY_MS,
    "failed": 30 * _DAY_MS,
    "cancelled": 30 * _DAY_MS,
}

#: The largest ``concurrency`` a queue of PIKKU_QUEUES may have: a worker
#: tries that many slot leases before it moves on.
MAX_QUEUE_CONCURRENCY = 1000

#: Settings that may be zero (every other one must be > 0).
ZERO_ALLOWED = frozenset({"PIKKU_STEP_RETRIES", "PIKKU_TIMEOUT_GRACE_MS", "PIKKU_TAKE_AHEAD_BELOW_MS"})


class Settings:
    """Typed, lazy access to the PIKKU_* settings."""

    def _get(self, name: str) -> Any:
        return getattr(django_settings, name, DEFAULTS[name])

    @property
    def LEASE_TTL_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_LEASE_TTL_MS"))

    @property
    def STEP_LEASE_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_STEP_LEASE_MS"))

    @property
    def STEP_RETRIES(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_STEP_RETRIES"))

    @property
    def STALLED_AFTER_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_STALLED_AFTER_MS"))

    @property
    def UNDISPATCHED_AFTER_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_UNDISPATCHED_AFTER_MS"))

    @property
    def LEASE_PRUNE_AFTER_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_LEASE_PRUNE_AFTER_MS"))

    @property
    def MAX_JSON_BYTES(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_MAX_JSON_BYTES"))

    @property
    def CODE_VERSION(self) -> str | None:  # noqa: N802
        """PIKKU_CODE_VERSION: the version runs are stamped with (None: a hash of the workflow's source)."""
        value = getattr(django_settings, "PIKKU_CODE_VERSION", None)
        return None if value in (None, "") else str(value)

    @property
    def ON_REPLAY_MISMATCH(self) -> str:  # noqa: N802
        """PIKKU_ON_REPLAY_MISMATCH: ``"fail"`` (default) or ``"park"`` a run whose history no longer fits."""
        return str(getattr(django_settings, "PIKKU_ON_REPLAY_MISMATCH", "fail"))

    @property
    def TIMEOUT_GRACE_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_TIMEOUT_GRACE_MS"))

    @property
    def TIMEOUT_MAX_ABANDONED(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_TIMEOUT_MAX_ABANDONED"))

    @property
    def TAKE_AHEAD_BELOW_MS(self) -> int:  # noqa: N802
        return int(self._get("PIKKU_TAKE_AHEAD_BELOW_MS"))

    @property
    def TASK_MODULES(self) -> list[str]:  # noqa: N802
        """Modules (and packages, with their modules) a stored task path may import (checks.py checks it)."""
        value = getattr(django_settings, "PIKKU_TASK_MODULES", ())
        return [name for name in value if isinstance(name, str)] if isinstance(value, (list, tuple)) else []

    @property
    def QUEUES(self) -> dict[str, dict[str, Any]]:  # noqa: N802
        """PIKKU_QUEUES: per-queue options, ``{"emails": {"concurrency": 2}}`` (checked by E007)."""
        return dict(getattr(django_settings, "PIKKU_QUEUES", {}))

    @property
    def RETENTION_MS(self) -> dict[str, int | None]:  # noqa: N802
        """PIKKU_RETENTION_MS over its defaults: how long each finished status is kept (checked by E011)."""
        return {**RETENTION_DEFAULTS, **dict(getattr(django_settings, "PIKKU_RETENTION_MS", {}))}

    @property
    def SCHEDULES(self) -> Any:  # noqa: N802
        """PIKKU_SCHEDULES: schedule names to entries, as the user wrote them (checked by E030–E035)."""
        return getattr(django_settings, "PIKKU_SCHEDULES", {})

    @property
    def METRICS_TOKEN(self) -> str | None:  # noqa: N802
        """PIKKU_METRICS_TOKEN: the bearer token that may read ``metrics/`` besides staff (None: no one)."""
        token = getattr(django_settings, "PIKKU_METRICS_TOKEN", None)
        return str(token) if token else None

    def concurrency(self, queue: str) -> int | None:
        """How many runs of ``queue`` may be driven at once everywhere; None when unlimited."""
        options = self.QUEUES.get(queue)
        return None if options is None else options.get("concurrency")

    def per_key_concurrency(self, queue: str) -> int | None:
        """How many runs of one key of ``queue`` may be driven at once everywhere; None when unlimited."""
        options = self.QUEUES.get(queue)
        per_key = None if options is None else options.get("per_key")
        return None if per_key is None else per_key.get("concurrency")

    def rate(self, queue: str) -> dict[str, Any] | None:
        """``queue``'s rate limit, ``{"limit", "period_ms", "burst", "per_key"}``; None when unlimited."""
        options = self.QUEUES.get(queue)
        return None if options is None else options.get("rate")

    def is_limited(self, queue: str) -> bool:
        """Is a run of ``queue`` driven only under a slot or a rate (its queue's, or its key's)?"""
        options = self.QUEUES.get(queue)
        return options is not None and (
            options.get("concurrency") is not None
            or self.per_key_concurrency(queue) is not None
            or options.get("rate") is not None
        )


conf = Settings()
