"""The lease store: each decision (acquire, refresh, release) is one guarded statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections, models, router
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql, validate
from pikku_django.clock import DbNowMs
from pikku_django.managers.base import ensure_autocommit
from pikku_django.sql.cursors import hot_cursor
from pikku_django.sql.drivers import driver

if TYPE_CHECKING:
    from pikku_django.models import Lease


class LeaseQuerySet(models.QuerySet["Lease"]):
    def live(self) -> LeaseQuerySet:
        """Leases whose holder still holds them, on the database clock."""
        return self.filter(expires_at__gt=DbNowMs())

    def lapsed(self) -> LeaseQuerySet:
        """Leases that have run out or been released."""
        return self.filter(expires_at__lte=DbNowMs())

    def expire(self) -> int:
        """Lapse these leases now, keeping their tokens; returns how many were live."""
        return self.live().update(expires_at=DbNowMs())


class LeaseManager(models.Manager["Lease"]):
    """Named leases on ``pikku_lease``, judged on the database's clock."""

    def get_queryset(self) -> LeaseQuerySet:
        return LeaseQuerySet(self.model, using=self._db)

    def live(self) -> LeaseQuerySet:
        return self.get_queryset().live()

    def lapsed(self) -> LeaseQuerySet:
        return self.get_queryset().lapsed()

    # -- the guarded operations ---------------------------------------------

    def _connection(self) -> BaseDatabaseWrapper:
        return connections[self.db if self._db else router.db_for_write(self.model)]

    def from_row(self, row: tuple[Any, ...], alias: str) -> Lease:
        """The lease of a row (key, holder, token, expires_at) read on ``alias``."""
        return self.model.from_db(
            alias, ["key", "holder", "token", "expires_at"], [row[0], row[1], int(row[2]), int(row[3])]
        )

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        """
        Take ``key`` for ``holder`` for ``ttl_ms`` unless someone else holds it;
        never blocks. Returns the lease, or None while another holder has it.
        """
        params = {
            "key": validate.name("key", key),
            "holder": validate.name("holder", holder),
            "ttl_ms": validate.positive_ms("ttl_ms", ttl_ms),
        }
        return self._acquire(params)

    def acquire_within(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        """
        ``acquire`` as one statement of the caller's transaction, which takes
        the work the lease guards in the same commit (a worker's take of a
        run). The caller relies on the lease only once that transaction has
        committed: rolled back, it was never granted, and its token never
        seen by anyone.
        """
        params = {
            "key": validate.name("key", key),
            "holder": validate.name("holder", holder),
            "ttl_ms": validate.positive_ms("ttl_ms", ttl_ms),
        }
        return self._acquire(params, within=True)

    def _acquire(
        self, params: dict[str, Any], *, portable: bool = False, within: bool = False
    ) -> Lease | None:
        connection = self._connection()
        if not within:
            ensure_autocommit(connection)
        with hot_cursor(connection) as cursor:
            # One statement; on MySQL 8, the upsert and its read-back (sql.MYSQL_LEASE_ACQUIRE).
            for text in sql.statements("lease_acquire", connection, portable=portable):
                cursor.execute(text, params)
            row = cursor.fetchone()
        if row is None or row[1] != params["holder"]:
            return None
        return self.from_row(row, connection.alias)

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        """
        Extend ``lease`` to now + ``ttl_ms`` while it is still this holder's, of
        this token, and live. Returns the renewed lease, or None if it was lost.
        """
        params = {
            "key": lease.key,
            "holder": lease.holder,
            "token": lease.token,
            "ttl_ms": validate.positive_ms("ttl_ms", ttl_ms),
        }
        connection = self._connection()
        ensure_autocommit(connection)
        with hot_cursor(connection) as cursor:
            cursor.execute(sql.statement("lease_refresh", connection), params)
            row = driver(connection).refreshed(cursor, lease)
        return None if row is None else self.from_row(row, connection.alias)

    def release(self, lease: Lease) -> bool:
        """
        Lapse ``lease`` if it is still this holder's, of this token, and live;
        the token stays. True if it was; False if it had already lapsed or
        passed to another holder (so it was not held to the end).
        """
        ensure_autocommit(self._connection())
        return self.release_within(lease)

    def release_within(self, lease: Lease) -> bool:
        """
        ``release`` as one statement of the caller's transaction, which
        records the last work the lease guarded in the same commit (a pass's
        outcome): rolled back, the lease is still held and lapses on its own.
        """
        connection = self._connection()
        with hot_cursor(connection) as cursor:
            cursor.execute(
                sql.statement("lease_release", connection),
                {"key": lease.key, "holder": lease.holder, "token": lease.token},
            )
            return bool(cursor.rowcount == 1)

    def current(self, key: str) -> Lease | None:
        """The live lease on ``key``, or None."""
        validate.name("key", key)
        connection = self._connection()
        with hot_cursor(connection) as cursor:
            cursor.execute(sql.statement("lease_current", connection), {"key": key})
            row = cursor.fetchone()
        return None if row is None else self.from_row(row, connection.alias)

    def db_now_ms(self) -> int:
        """Now, in epoch ms, on the clock leases are judged by."""
        connection = self._connection()
        with hot_cursor(connection) as cursor:
            cursor.execute(sql.statement("db_now", connection))
            (now,) = cursor.fetchone()
        return int(now)
