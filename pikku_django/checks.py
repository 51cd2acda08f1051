"""System checks for the PIKKU_* settings and the database connections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register

from pikku_django.conf import DEFAULTS, ZERO_ALLOWED

#: Stable check ids, one per setting (documented in the README).
SETTING_CHECK_IDS: dict[str, str] = {
    "PIKKU_LEASE_TTL_MS": "pikku_django.E001",
    "PIKKU_STEP_LEASE_MS": "pikku_django.E002",
    "PIKKU_STEP_RETRIES": "pikku_django.E003",
    "PIKKU_STALLED_AFTER_MS": "pikku_django.E004",
    "PIKKU_UNDISPATCHED_AFTER_MS": "pikku_django.E005",
    "PIKKU_LEASE_PRUNE_AFTER_MS": "pikku_django.E006",
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
                    hint=f"Set {name} to a whole number of "
                    f"{'retries' if name in ZERO_ALLOWED else 'milliseconds'}, "
                    f"or remove it to use the default ({DEFAULTS[name]}).",
                    id=check_id,
                )
            )
    return errors


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
