"""System checks for the PIKKU_* settings and the database connections."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning

from pikku_django import validate
from pikku_django.conf import DEFAULTS, MAX_QUEUE_CONCURRENCY, RETENTION_DEFAULTS, ZERO_ALLOWED
from pikku_django.errors import InvalidArgumentError
from pikku_django.schedules.config import read

try:
    from pikku_django.tasks import compat as tasks_compat
except ImportError:  # Django 5.2 without the django-tasks backport: no Tasks backend can load
    tasks_compat = None  # type: ignore[assignment]

#: Stable check ids, one per setting (documented in docs/settings.md).
SETTING_CHECK_IDS: dict[str, str] = {
    "PIKKU_LEASE_TTL_MS": "pikku_django.E001",
    "PIKKU_STEP_LEASE_MS": "pikku_django.E002",
    "PIKKU_STEP_RETRIES": "pikku_django.E003",
    "PIKKU_STALLED_AFTER_MS": "pikku_django.E004",
    "PIKKU_UNDISPATCHED_AFTER_MS": "pikku_django.E005",
    "PIKKU_LEASE_PRUNE_AFTER_MS": "pikku_django.E006",
    "PIKKU_MAX_JSON_BYTES": "pikku_django.E008",
    "PIKKU_TAKE_AHEAD_BELOW_MS": "pikku_django.E009",
    "PIKKU_TIMEOUT_GRACE_MS": "pikku_django.E041",
    "PIKKU_TIMEOUT_MAX_ABANDONED": "pikku_django.E042",
}


#: What each setting that is not in milliseconds counts.
UNITS = {
    "PIKKU_STEP_RETRIES": "retries",
    "PIKKU_MAX_JSON_BYTES": "bytes",
    "PIKKU_TIMEOUT_MAX_ABANDONED": "threads",
}


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
    """PIKKU_QUEUES maps queue names to their options (``queue_entry_problem``)."""
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
        problem = queue_entry_problem(queue, options)
        if problem is not None:
            errors.append(
                Error(
                    problem,
                    hint=f"Say how many runs of the queue (or of one key of it) may be driven at once "
                    f"everywhere, e.g. {example}; leave a queue out to leave it unlimited.",
                    id=QUEUES_CHECK_ID,
                )
            )
    return errors


def queue_entry_problem(queue: str, options: Any) -> str | None:
    """What is wrong with ``queue``'s entry in PIKKU_QUEUES, naming the setting's key; None if nothing."""
    where = f"PIKKU_QUEUES[{queue!r}]"
    if not isinstance(options, dict):
        return f"{where} must be a dict of options, not {options!r}."
    unknown = sorted(set(options) - QUEUE_OPTIONS)
    if unknown:
        return f"{where} has unknown options {unknown}; the options are {sorted(QUEUE_OPTIONS)}."
    if "concurrency" in options and not _is_count(options["concurrency"]):
        return (
            f"{where}['concurrency'] must be an int from 1 to {MAX_QUEUE_CONCURRENCY}, "
            f"not {options['concurrency']!r}."
        )
    if options.get("rate") is not None:
        problem = _rate_problem(f"{where}['rate']", options["rate"])
        if problem is not None:
            return problem
    per_key = options.get("per_key")
    if per_key is None:
        return None
    if not isinstance(per_key, dict) or set(per_key) != {"concurrency"}:
        return f"{where}['per_key'] must be {{'concurrency': int}}, not {per_key!r}."
    if not _is_count(per_key["concurrency"]):
        return (
            f"{where}['per_key']['concurrency'] must be an int from 1 to {MAX_QUEUE_CONCURRENCY}, "
            f"not {per_key['concurrency']!r}."
        )
    return None


#: The options a queue's entry in PIKKU_QUEUES may have.
QUEUE_OPTIONS = frozenset({"concurrency", "per_key", "rate"})
#: The options of a queue's ``rate`` (``limit`` and ``period_ms`` required).
RATE_OPTIONS = frozenset({"limit", "period_ms", "burst", "per_key"})


def _rate_problem(where: str, rate: Any) -> str | None:
    """What is wrong with a queue's ``rate`` (``where`` names it); None if nothing."""
    if not isinstance(rate, dict) or not {"limit", "period_ms"} <= set(rate) <= RATE_OPTIONS:
        return (
            f"{where} must be a dict with 'limit' and 'period_ms' (and optionally 'burst', 'per_key'), "
            f"not {rate!r}."
        )
    for name, floor in (("limit", 1), ("period_ms", 1), ("burst", 0)):
        value = rate.get(name, floor)
        if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= MAX_RATE_VALUE:
            return f"{where}[{name!r}] must be an int from {floor} to {MAX_RATE_VALUE}, not {value!r}."
    if not isinstance(rate.get("per_key", False), bool):
        return f"{where}['per_key'] must be True or False, not {rate['per_key']!r}."
    return None


#: The largest ``limit``, ``period_ms`` or ``burst`` of a rate (a year of ms).
MAX_RATE_VALUE = 365 * 24 * 3600 * 1000


def _is_count(value: Any) -> bool:
    """A slot count: an int from 1 to ``MAX_QUEUE_CONCURRENCY`` (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_QUEUE_CONCURRENCY


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
    if tasks_compat is None or tasks_compat.framework_checks_backends():
        return []
    return [message for alias in ours for message in tasks_compat.task_backends[alias].check()]


#: The check ids of PIKKU_TASK_MODULES: not a list of dotted names; a name not importable.
TASK_MODULES_CHECK_ID = "pikku_django.E022"
TASK_MODULE_MISSING_CHECK_ID = "pikku_django.W022"


@register(Tags.compatibility)
def check_task_modules(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """
    PIKKU_TASK_MODULES is a list of dotted module names (modules outside the
    installed apps whose tasks a worker may import); each is imported here,
    and one that cannot be is a warning.
    """
    value = getattr(django_settings, "PIKKU_TASK_MODULES", [])
    hint = 'Name the modules (or packages) of your tasks, e.g. PIKKU_TASK_MODULES = ["mysite.jobs"].'
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(name, str) and all(part.isidentifier() for part in name.split(".")) for name in value
    ):
        return [
            Error(
                f"PIKKU_TASK_MODULES must be a list of dotted module names, not {value!r}.",
                hint=hint,
                id=TASK_MODULES_CHECK_ID,
            )
        ]
    warnings: list[CheckMessage] = []
    for name in value:
        try:
            importlib.import_module(name)
        except ImportError as e:
            warnings.append(
                CheckWarning(
                    f"PIKKU_TASK_MODULES names {name!r}, which cannot be imported: {e}",
                    hint="A worker refuses every task of a module it cannot import: fix the name or "
                    "the module.",
                    id=TASK_MODULE_MISSING_CHECK_ID,
                )
            )
    return warnings


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
    _, bad = read()
    return [
        (CheckWarning if ".W" in check_id else Error)(message, hint=hint, id=check_id)
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


#: The check ids of the safe-deploy settings (docs/safe-deploys.md).
REPLAY_MISMATCH_CHECK_ID = "pikku_django.E060"
CODE_VERSION_CHECK_ID = "pikku_django.E061"


@register(Tags.compatibility)
def check_safe_deploys(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """PIKKU_ON_REPLAY_MISMATCH is "fail" or "park"; PIKKU_CODE_VERSION a str that fits its column."""
    errors: list[CheckMessage] = []
    mismatch = getattr(django_settings, "PIKKU_ON_REPLAY_MISMATCH", "fail")
    if mismatch not in ("fail", "park"):
        errors.append(
            Error(
                f'PIKKU_ON_REPLAY_MISMATCH must be "fail" or "park", not {mismatch!r}.',
                hint='"fail" fails a run whose history no longer fits the code; "park" suspends it '
                "until retry_workflow().",
                id=REPLAY_MISMATCH_CHECK_ID,
            )
        )
    version = getattr(django_settings, "PIKKU_CODE_VERSION", None)
    if version is not None:
        try:
            validate.name("PIKKU_CODE_VERSION", version)
        except InvalidArgumentError as error:
            errors.append(
                Error(
                    str(error),
                    hint="Set it to your release's name (a git SHA, a tag), or remove it: the default "
                    "is a hash of each workflow's source.",
                    id=CODE_VERSION_CHECK_ID,
                )
            )
    return errors
