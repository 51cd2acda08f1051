"""
A long-running command's first look at its database: one clear line, and
no traceback, for a database that does not exist or is not (fully)
migrated, which waiting will not mend; a database out of reach is waited
for, and said so once.
"""

from __future__ import annotations

import threading

from django.db import connections

from pikku_django import outages
from pikku_django.errors import DatabaseMissingError, DatabaseNotMigratedError, DatabaseUnavailableError
from pikku_django.outages import OUTAGE_ERRORS, Outage, raise_if_not_migrated
from pikku_django.sql.drivers import driver
from pikku_django.sql.schema import unapplied_migrations

__all__ = ["wait_for_database"]


def wait_for_database(using: str, *, stopping: threading.Event, once: bool = False) -> bool:
    """
    Wait until ``using``'s database answers and holds every migration of
    the app; False if ``stopping`` was set meanwhile. Raises
    ``DatabaseMissingError`` or ``DatabaseNotMigratedError`` at once, and,
    with ``once``, ``DatabaseUnavailableError`` after ``ONCE_GIVES_UP_AFTER_S``.
    """
    connection = connections[using]
    vendor = driver(connection)
    name = str(connection.settings_dict["NAME"])
    if vendor.missing_database(connection, None):
        raise DatabaseMissingError(using, name)
    outage = Outage(f"Database {using!r}")
    while True:
        try:
            connection.ensure_connection()
            missing = unapplied_migrations(connection)
        except OUTAGE_ERRORS as error:
            if vendor.missing_database(connection, error):
                raise DatabaseMissingError(using, name) from None
            raise_if_not_migrated(error)
            delay = outage.failed(error)
            if once and outage.lasted >= outages.ONCE_GIVES_UP_AFTER_S:
                raise DatabaseUnavailableError(outage.lasted, error) from error
            if stopping.wait(delay):
                return False
            continue
        outage.succeeded()
        if missing:
            raise DatabaseNotMigratedError(
                f"{len(missing)} of pikku_django's migrations are not applied, from {missing[0]}"
            )
        return True
