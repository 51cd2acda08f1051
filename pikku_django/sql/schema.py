"""
Whether an error says a table is missing (``manage.py migrate`` was never
run), or the database itself, decided from the server's own code for it,
never from a message a pooler or another statement might also print
("prepared statement ... does not exist" is no missing table); and which of
the app's migrations a database lacks.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader

#: PostgreSQL's SQLSTATE undefined_table.
POSTGRESQL_UNDEFINED_TABLE = "42P01"
#: MySQL/MariaDB's ER_NO_SUCH_TABLE.
MYSQL_NO_SUCH_TABLE = 1146
#: PostgreSQL's SQLSTATE invalid_catalog_name: no database of that name.
POSTGRESQL_INVALID_CATALOG = "3D000"
#: MySQL/MariaDB's ER_BAD_DB_ERROR ("Unknown database").
MYSQL_BAD_DB = 1049
#: SQLite has no code of its own for it (SQLITE_ERROR): its fixed message says it.
SQLITE_NO_SUCH_TABLE = "no such table: "


def is_undefined_table(error: BaseException) -> bool:
    """True when ``error`` (or the driver's error it wraps) says a table is missing."""
    for cause in (error, error.__cause__):
        if cause is None:
            continue
        sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if sqlstate is not None:
            return bool(sqlstate == POSTGRESQL_UNDEFINED_TABLE)
        args = getattr(cause, "args", ())
        if args and isinstance(args[0], int):
            return bool(args[0] == MYSQL_NO_SUCH_TABLE)
        if isinstance(cause, sqlite3.Error):
            return str(cause).startswith(SQLITE_NO_SUCH_TABLE)
    return False


def causes(error: BaseException) -> tuple[BaseException, ...]:
    """``error`` and the driver's error it wraps (Django's ``__cause__``), if any."""
    return (error,) if error.__cause__ is None else (error, error.__cause__)


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE a PostgreSQL driver's error carries (None for a connection refused before one)."""
    for cause in causes(error):
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if code is not None:
            return str(code)
    return None


def errno(error: BaseException) -> int | None:
    """The error number a MySQL/MariaDB driver's error carries first in its arguments."""
    for cause in causes(error):
        args: Any = getattr(cause, "args", ())
        if args and isinstance(args[0], int):
            return int(args[0])
    return None


def unapplied_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """
    The app's migrations that ``connection``'s database lacks, in order (all
    of them when ``manage.py migrate`` never ran, the later ones when it is
    partly migrated): one read of ``django_migrations``.
    """
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    plan = [
        key
        for key in loader.graph.forwards_plan(*loader.graph.leaf_nodes("pikku_django"))
        if key[0] == "pikku_django"
    ]
    return [name for app, name in plan if (app, name) not in loader.applied_migrations]
