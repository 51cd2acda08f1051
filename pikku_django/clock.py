"""
"Now in epoch milliseconds" as SQL, per database vendor: the one clock every
lease and step lease is written and judged on.

A lease is judged by whichever worker reads it next, so judging it on each
worker's own clock would let a worker whose clock runs fast take a live lease.
PostgreSQL and MySQL/MariaDB read the server's clock, which every worker
shares; SQLite reads the process clock, which is the same clock for every
process on its one host.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BigIntegerField, DateTimeField, Expression, Func

if TYPE_CHECKING:
    from django.db.models.sql.compiler import _AsSqlType

#: clock_timestamp(), not now(): now() is frozen at the start of the transaction.
POSTGRESQL_NOW_MS = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"

#: Counted from UTC_TIMESTAMP(6), never NOW() or UNIX_TIMESTAMP(NOW()): those
#: follow the session time zone, and when it falls back an hour two real
#: instants share one local time. Both operands are DATETIMEs, so no zone
#: conversion happens. UTC_TIMESTAMP is fixed for the whole statement.
MYSQL_NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"

#: SQLite's 'now' is the process clock, fixed for the whole statement.
SQLITE_NOW_MS = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"

_NOW_MS = {
    "postgresql": POSTGRESQL_NOW_MS,
    "mysql": MYSQL_NOW_MS,
    "sqlite": SQLITE_NOW_MS,
}


def now_ms_sql(connection: BaseDatabaseWrapper) -> str:
    """The SQL expression for now, in epoch ms, on this connection's clock."""
    try:
        return _NOW_MS[connection.vendor]
    except KeyError:
        raise NotSupportedError(
            f"pikku_django supports PostgreSQL, MySQL/MariaDB and SQLite, not {connection.vendor!r}."
        ) from None


class DbNowMs(Expression):
    """The database clock's now, in epoch ms, for use in ORM queries."""

    output_field = BigIntegerField()

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        return f"({now_ms_sql(connection)})", ()

    def as_postgresql(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        # A scalar subquery is evaluated once per statement, so the planner can
        # use it as an index bound; bare clock_timestamp() is volatile and can't be.
        return f"(SELECT {POSTGRESQL_NOW_MS})", ()


def sqlite_now_text(connection: BaseDatabaseWrapper, minus_ms: int = 0) -> str:
    """
    Now (less ``minus_ms``) in UTC as SQLite stores a datetime. With USE_TZ =
    False it is written naive, still in UTC (as MySQL's UTC_TIMESTAMP is), so
    that every instant the runtime stores reads back to the same epoch ms.
    """
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(milliseconds=minus_ms)
    return str(connection.ops.adapt_datetimefield_value(as_stored(now)))


def as_stored(moment: datetime.datetime) -> datetime.datetime:
    """An aware UTC instant as a DateTimeField stores it: aware, or naive UTC when USE_TZ = False."""
    return moment if settings.USE_TZ else moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)


class EpochMs(Func):
    """
    A datetime column the runtime wrote (always a UTC instant: ``DbNow``) as
    epoch milliseconds, so that delays and ages are judged in ms on the
    database clock, whatever USE_TZ says.
    """

    output_field = BigIntegerField()

    def as_postgresql(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        return self.as_sql(
            compiler, connection, template="FLOOR(EXTRACT(EPOCH FROM %(expressions)s) * 1000)::bigint"
        )

    def as_mysql(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        return self.as_sql(
            compiler,
            connection,
            template="(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', %(expressions)s) DIV 1000)",
        )

    def as_sqlite(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        return self.as_sql(
            compiler,
            connection,
            template="CAST(ROUND((julianday(%(expressions)s) - 2440587.5) * 86400000.0) AS INTEGER)",
        )


class DbNow(Expression):
    """
    The database clock's now as a datetime, optionally ``minus_ms`` earlier,
    for the DateTimeFields (``updated_at`` and friends) the runtime writes, so
    that idle windows are judged on one clock whoever wrote the row.
    """

    output_field = DateTimeField()

    def __init__(self, minus_ms: int = 0) -> None:
        super().__init__()
        self.minus_ms = int(minus_ms)

    def as_postgresql(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        # A scalar subquery: evaluated once, usable as an index bound (see DbNowMs).
        if not self.minus_ms:
            return "(SELECT clock_timestamp())", ()
        return "(SELECT clock_timestamp() - %s * INTERVAL '1 millisecond')", (self.minus_ms,)

    def as_mysql(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        # Django stores UTC in DATETIME(6) columns on MySQL.
        if not self.minus_ms:
            return "UTC_TIMESTAMP(6)", ()
        return "(UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND)", (self.minus_ms * 1000,)

    def as_sqlite(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        # The process clock, bound as a parameter so that Django writes it in
        # exactly the text format it stores datetimes in (and compares them by).
        return "%s", (sqlite_now_text(connection, self.minus_ms),)

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> _AsSqlType:
        raise NotSupportedError(
            f"pikku_django supports PostgreSQL, MySQL/MariaDB and SQLite, not {connection.vendor!r}."
        )


def local_now(connection: BaseDatabaseWrapper) -> datetime.datetime | None:
    """
    Now on the database clock read in this process, where that clock is the
    process's own (SQLite, see the module docstring; ``DbNow`` binds the same
    value there); None where it is the server's. A write may then carry the
    values a statement would compute, and need not read them back.

    Cut to the millisecond, as SQLite's own 'now' is: rounded, a value read
    in the second half of a millisecond would lie ahead of every statement's
    now until the next one, and a run started then would not yet be due.
    """
    if connection.vendor == "sqlite":
        now = datetime.datetime.now(datetime.timezone.utc)
        return now.replace(microsecond=now.microsecond // 1000 * 1000)
    return None


def epoch_ms(moment: datetime.datetime) -> int:
    """An aware datetime as epoch milliseconds."""
    return round(moment.timestamp() * 1000)
