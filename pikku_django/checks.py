"""System checks for the PIKKU_* settings and the database connections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register

from pikku_django import validate
from pikku_django.conf import DEFAULTS, MAX_QUEUE_CONCURRENCY, RETENTION_DEFAULTS, ZERO_ALLOWED
from pikku_django.errors import InvalidArgumentError

#: Stable check ids, one per setting (documented in the README).
SETTING_CHECK_IDS: dict[str, str] = {
    "PIKKU_LEASE_TTL_MS": "pikku_django.E001",
    "PIKKU_STEP_LEASE_MS": "pikku_django.E002",
    "PIKKU_STEP_RETRIES": "pikku_django.E003",
    "PIKKU_STALLED_AFTER_MS": "pikku_django.E004",
    "PIKKU_UNDISPATCHED_AFTER_MS": "pikku_django.E005",
    "PIKKU_LEASE_PRUNE_AFTER_MS": "pikku_django.E006",
    "PIKKU_MAX_JSON_BYTES": "pikku_django.E008",
}


#: What each setting that is not in milliseconds counts.
UNITS = {"PIKKU_STEP_RETRIES": "retries", "PIKKU_MAX_JSON_BYTES": "bytes"}


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Each PIKKU_* setting must be a whole number in its range."""
    errors: list[CheckMessage] = []
    for name, check_id in SETTING_CHECK_IDS.items():
        value = getattr(django_settings, name, DEFAULTS[name])
        floor = 0 if name in ZERO_ALLOWED else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < floor:
            errors.append(
                Error(
                    f"{name} must be an int >= {floor}, not {value!r}.",
                    hint=f"Set {name} to a whole number of {UNITS.get(name, 'milliseconds')}, "
                    f"or remove it to use the default ({DEFAULTS[name]}).",
                    id=check_id,
                )
            )
    return errors


#: The check id of PIKKU_QUEUES.
QUEUES_CHECK_ID = "pikku_django.E007"


@register(Tags.compatibility)
def check_queues(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """PIKKU_QUEUES maps queue names to ``{"concurrency": int >= 1}``."""
    value = getattr(django_settings, "PIKKU_QUEUES", {})
    example = 'PIKKU_QUEUES = {"emails": {"concurrency": 2}}'
    if not isinstance(value, dict):
        return [
            Error(
                f"PIKKU_QUEUES must be a dict, not {type(value).__name__}.",
                hint=f"Map each limited queue to its options, e.g. {example}.",
                id=QUEUES_CHECK_ID,
            )
        ]
    errors: list[CheckMessage] = []
    for queue, options in value.items():
        try:
            validate.queue_name("queue", queue)
        except InvalidArgumentError as e:
            errors.append(
                Error(f"PIKKU_QUEUES has a bad queue name {queue!r}: {e}", hint=example, id=QUEUES_CHECK_ID)
            )
            continue
        concurrency = options.get("concurrency") if isinstance(options, dict) else None
        unknown = sorted(set(options) - {"concurrency"}) if isinstance(options, dict) else []
        if (
            unknown
            or isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= MAX_QUEUE_CONCURRENCY
        ):
            errors.append(
                Error(
                    f"PIKKU_QUEUES[{queue!r}] must be {{'concurrency': int}} with 1 <= concurrency <= "
                    f"{MAX_QUEUE_CONCURRENCY}, not {options!r}.",
                    hint=f"Say how many runs of the queue may be driven at once everywhere, e.g. {example}; "
                    "leave a queue out to leave it unlimited.",
                    id=QUEUES_CHECK_ID,
                )
            )
    return errors


@register(Tags.compatibility)
def check_task_backends(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """
    Each PikkuTaskBackend's own check (pikku_django.E020, E021), where the
    Tasks framework's check does not run it (Django 5.2 without the
    ``django_tasks`` app installed).
    """
    backends = getattr(django_settings, "TASKS", None) or {}
    ours = [
        alias
        for alias, config in backends.items()
        if isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("pikku_django.")
    ]
    if not ours:
        return []
    from pikku_django.tasks.compat import framework_checks_backends, task_backends

    if framework_checks_backends():
        return []
    return [message for alias in ours for message in task_backends[alias].check()]


#: The check id of PIKKU_RETENTION_MS.
RETENTION_CHECK_ID = "pikku_django.E011"


@register(Tags.compatibility)
def check_retention(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """PIKKU_RETENTION_MS maps finished run statuses to milliseconds (> 0) or None."""
    value = getattr(django_settings, "PIKKU_RETENTION_MS", {})
    example = 'PIKKU_RETENTION_MS = {"completed": 86_400_000, "failed": None}'
    if not isinstance(value, dict):
        return [
            Error(
                f"PIKKU_RETENTION_MS must be a dict, not {type(value).__name__}.",
                hint=f"Map finished statuses to how long their runs are kept, e.g. {example}.",
                id=RETENTION_CHECK_ID,
            )
        ]
    errors: list[CheckMessage] = []
    for status, keep_ms in value.items():
        if status not in RETENTION_DEFAULTS:
            errors.append(
                Error(
                    f"PIKKU_RETENTION_MS has an unknown status {status!r}.",
                    hint=f"Use the finished statuses {sorted(RETENTION_DEFAULTS)}.",
                    id=RETENTION_CHECK_ID,
                )
            )
            continue
        if keep_ms is None:
            continue
        try:
            validate.positive_ms(f"PIKKU_RETENTION_MS[{status!r}]", keep_ms)
        except InvalidArgumentError as e:
            errors.append(
                Error(
                    str(e),
                    hint=f"Give milliseconds > 0, or None to keep {status} runs for ever; e.g. {example}.",
                    id=RETENTION_CHECK_ID,
                )
            )
    return errors


@register(Tags.compatibility)
def check_schedules(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Each PIKKU_SCHEDULES entry: one known target, a cron and a time zone that parse, known keys."""
    from pikku_django.schedule_config import read

    _, bad = read()
    return [
        Error(message, hint=hint, id=check_id)
        for problems in bad.values()
        for check_id, message, hint in problems
    ]


@register(Tags.database)
def check_mysql_found_rows(
    app_configs: Sequence[Any] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Lease refresh on MySQL reads rows *matched*, which needs CLIENT.FOUND_ROWS."""
    errors: list[CheckMessage] = []
    for alias in databases or ():
        config = django_settings.DATABASES.get(alias, {})
        if "mysql" not in config.get("ENGINE", ""):
            continue
        flag = config.get("OPTIONS", {}).get("client_flag")
        if flag is None:
            continue  # Django's MySQL backend sets CLIENT.FOUND_ROWS itself.
        from MySQLdb.constants.CLIENT import FOUND_ROWS

        if not flag & FOUND_ROWS:
            errors.append(
                Error(
                    f"DATABASES[{alias!r}]['OPTIONS']['client_flag'] drops CLIENT.FOUND_ROWS.",
                    hint="pikku_django decides lease refreshes by rows matched; "
                    "OR MySQLdb.constants.CLIENT.FOUND_ROWS into client_flag.",
                    id="pikku_django.E010",
                )
            )
    return errors
