"""
Every guarded statement, one named constant per vendor.

Each decision (take a lease, renew it, claim a step, fence an attempt) is one
statement whose WHERE clause *is* the decision: two workers racing on the same
row are serialised by the row lock, the loser's guard no longer matches, and
its statement changes nothing. Nothing is read first and judged in Python.

Templates use ``{now}`` for the clock (``clock.py``), ``{lease}`` (and the
like) for quoted table names and ``{step_columns}`` for the step's columns;
values are always ``%(name)s`` parameters. ``statement()`` picks the variant
for a connection and is the only place that does.
"""

from __future__ import annotations

import functools

from django.apps import apps
from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django.clock import MYSQL_NOW_MS, POSTGRESQL_NOW_MS, SQLITE_NOW_MS
from pikku_django.sql.attempts import ATTEMPT_STATEMENTS
from pikku_django.sql.ends import END_STATEMENTS
from pikku_django.sql.leases import (
    DB_NOW,
    LEASE_STATEMENTS,
    MARIADB_LEASE_ACQUIRE,
    MYSQL_LEASE_ACQUIRE,
    MYSQL_LEASE_CURRENT,
    MYSQL_LEASE_REFRESH,
    MYSQL_LEASE_RELEASE,
    MYSQL_LEASE_UPSERT,
    POSTGRESQL_LEASE_ACQUIRE,
    POSTGRESQL_LEASE_CURRENT,
    POSTGRESQL_LEASE_REFRESH,
    POSTGRESQL_LEASE_RELEASE,
    SQLITE_LEASE_ACQUIRE,
    SQLITE_LEASE_CURRENT,
    SQLITE_LEASE_REFRESH,
    SQLITE_LEASE_RELEASE,
)
from pikku_django.sql.rollup import ROLLUP_STATEMENTS
from pikku_django.sql.runs import MYSQL_RUN_TAKE_LOCK, POSTGRESQL_RUN_TAKE, RUN_STATEMENTS
from pikku_django.sql.steps import (
    MYSQL_STEP_CLAIM,
    MYSQL_STEP_CLAIM_HISTORY,
    POSTGRESQL_STEP_CLAIM,
    SQLITE_STEP_CLAIM,
    SQLITE_STEP_CLAIM_HISTORY,
    STEP_STATEMENTS,
)

Variants = dict[str, "str | tuple[str, ...]"]

#: Every statement by name: ``{name: {variant: template}}``. A variant missing
#: for ``mariadb`` falls back to ``mysql``.
STATEMENTS: dict[str, Variants] = {
    **LEASE_STATEMENTS,
    **STEP_STATEMENTS,
    **ATTEMPT_STATEMENTS,
    **RUN_STATEMENTS,
    **END_STATEMENTS,
    **ROLLUP_STATEMENTS,
}

_NOW = {"postgresql": POSTGRESQL_NOW_MS, "sqlite": SQLITE_NOW_MS, "mysql": MYSQL_NOW_MS}


def variant(connection: BaseDatabaseWrapper) -> str:
    """``postgresql``, ``sqlite``, ``mysql`` or ``mariadb``; anything else is refused."""
    vendor = connection.vendor
    if vendor == "mysql" and connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        return "mariadb"
    if vendor in _NOW:
        return vendor
    raise NotSupportedError(f"pikku_django supports PostgreSQL, MySQL/MariaDB and SQLite, not {vendor!r}.")


def statements(name: str, connection: BaseDatabaseWrapper, *, portable: bool = False) -> tuple[str, ...]:
    """
    The statements of ``name`` for this connection, with the clock and table
    names filled in: one, except where a vendor needs more (MySQL's acquire).
    ``portable=True`` takes the MySQL form on MariaDB too (tests prove both
    forms there).
    """
    which = variant(connection)
    if portable and which == "mariadb":
        which = "mysql"
    rendered = _render(name, which)
    return rendered if isinstance(rendered, tuple) else (rendered,)


def statement(name: str, connection: BaseDatabaseWrapper) -> str:
    """The one statement ``name`` for this connection."""
    (text,) = statements(name, connection)
    return text


#: Now as a datetime, for the DateTimeFields (see ``clock.DbNow``). SQLite
#: takes it as the ``now_dt`` parameter, which ``now_params()`` supplies.
_NOW_DT = {"postgresql": "clock_timestamp()", "sqlite": "%(now_dt)s", "mysql": "UTC_TIMESTAMP(6)"}


#: The tables a template names, by placeholder.
_TABLES = {
    "lease": "Lease",
    "floor": "LeaseTokenFloor",
    "run": "WorkflowRun",
    "step": "WorkflowStep",
    "attempt": "WorkflowStepAttempt",
    "queue": "WorkflowQueue",
    "minute": "WorkflowMinute",
}


@functools.cache
def _render(name: str, which: str) -> str | tuple[str, ...]:
    variants = STATEMENTS[name]
    template = variants.get(which) or variants["mysql"]
    vendor = "mysql" if which == "mariadb" else which
    quote = "`{}`" if vendor == "mysql" else '"{}"'
    fill = {
        "now": _NOW[vendor],
        "now_dt": _NOW_DT[vendor],
        # The registry, not an import: the models import this package.
        **{
            name: quote.format(apps.get_model("pikku_django", model)._meta.db_table)
            for name, model in _TABLES.items()
        },
    }
    columns = [
        quote.format(f.column) for f in apps.get_model("pikku_django", "WorkflowStep")._meta.concrete_fields
    ]
    fill["step_columns"] = ", ".join(columns)
    fill["step_columns_s"] = ", ".join(f"s.{column}" for column in columns)
    if isinstance(template, tuple):
        return tuple(part.format(**fill) for part in template)
    return template.format(**fill)


#: The collation that makes key and holder columns compare byte for byte.
#: MySQL/MariaDB's default collations fold case and pad spaces, which would
#: make "Report:1" and "report:1 " one key and one holder; the NO PAD binary
#: collations do neither. PostgreSQL and SQLite already compare exactly.
EXACT_COLLATIONS = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}


def exact_collation(connection: BaseDatabaseWrapper) -> str | None:
    """The byte-for-byte collation for this connection, or None where it is the default."""
    return EXACT_COLLATIONS.get(variant(connection))


def exact_char_type(connection: BaseDatabaseWrapper, max_length: int) -> str | None:
    """
    The column type of an exact string column, or None for Django's own. On
    MySQL/MariaDB the character set is spelled out, since the collation above
    belongs to utf8mb4 whatever the database's default character set is.
    """
    if connection.vendor == "mysql":
        return f"varchar({max_length}) CHARACTER SET utf8mb4"
    return None


__all__ = [
    "DB_NOW",
    "EXACT_COLLATIONS",
    "MARIADB_LEASE_ACQUIRE",
    "MYSQL_LEASE_ACQUIRE",
    "MYSQL_LEASE_CURRENT",
    "MYSQL_LEASE_REFRESH",
    "MYSQL_LEASE_RELEASE",
    "MYSQL_LEASE_UPSERT",
    "MYSQL_RUN_TAKE_LOCK",
    "MYSQL_STEP_CLAIM",
    "MYSQL_STEP_CLAIM_HISTORY",
    "POSTGRESQL_LEASE_ACQUIRE",
    "POSTGRESQL_LEASE_CURRENT",
    "POSTGRESQL_LEASE_REFRESH",
    "POSTGRESQL_LEASE_RELEASE",
    "POSTGRESQL_RUN_TAKE",
    "POSTGRESQL_STEP_CLAIM",
    "SQLITE_LEASE_ACQUIRE",
    "SQLITE_LEASE_CURRENT",
    "SQLITE_LEASE_REFRESH",
    "SQLITE_LEASE_RELEASE",
    "SQLITE_STEP_CLAIM",
    "SQLITE_STEP_CLAIM_HISTORY",
    "STATEMENTS",
    "exact_char_type",
    "exact_collation",
    "statement",
    "statements",
    "variant",
]
