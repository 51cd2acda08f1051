"""
One class per database vendor that runs that vendor's guarded statements and
reads their answers: how many round trips a write takes there (one statement,
a multi-statement batch, a short transaction) and where its answer lies (a
``RETURNING`` row, the rows matched, ``LAST_INSERT_ID``). The statement texts
are ``pikku_django.sql``'s; the managers validate, build models and decide,
and hold no ``if vendor``.

- ``base.Driver``: the portable form, a short transaction around the
  statement and its history row (SQLite's).
- ``postgresql.PostgreSQLDriver``: the statement and its history row are one
  statement (data-modifying CTEs).
- ``mysql.MySQLDriver``: MySQL/MariaDB, a batch in one round trip, answers
  from rows matched and ``LAST_INSERT_ID``.
"""

from __future__ import annotations

import functools

from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django.sql.drivers.base import Driver
from pikku_django.sql.drivers.mysql import MySQLDriver
from pikku_django.sql.drivers.postgresql import PostgreSQLDriver
from pikku_django.sql.drivers.sqlite import SQLiteDriver

__all__ = ["Driver", "driver"]


def driver(connection: BaseDatabaseWrapper) -> Driver:
    """The driver of ``connection``'s vendor; an unsupported vendor is refused."""
    return _for_vendor(connection.vendor)


@functools.cache
def _for_vendor(vendor: str) -> Driver:
    try:
        return _DRIVERS[vendor]()
    except KeyError:
        raise NotSupportedError(
            f"pikku_django supports PostgreSQL, MySQL/MariaDB and SQLite, not {vendor!r}."
        ) from None


_DRIVERS: dict[str, type[Driver]] = {
    "postgresql": PostgreSQLDriver,
    "mysql": MySQLDriver,
    "sqlite": SQLiteDriver,
}
