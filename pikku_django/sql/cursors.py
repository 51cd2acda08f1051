"""
How the stores run their statements: the hot cursor (prepared on PostgreSQL,
with its fallback behind a pooler), rows read back as models, SQLite's clock
parameter, its write lock and the pause that lets its waiting writers in.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.apps import apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

from pikku_django import sql
from pikku_django.clock import sqlite_now_text

M = TypeVar("M", bound=Model)


def take_write_lock(alias: str) -> None:
    """
    Inside a transaction that reads before it writes: on SQLite, take the
    database's write lock now. Under Django's default DEFERRED transactions a
    transaction that first reads holds a shared lock, and SQLite does not wait
    to upgrade it ("database is locked" at once, whatever the timeout); a
    first write instead waits its turn under the busy timeout. An UPDATE that
    matches no row takes the lock and changes nothing. Elsewhere row locks do
    this work, and nothing is sent.
    """
    connection = connections[alias]
    if connection.vendor != "sqlite" or not connection.in_atomic_block:
        return
    # The registry, not an import: the models import this module's users.
    table = connection.ops.quote_name(apps.get_model("pikku_django", "LeaseTokenFloor")._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET token = token WHERE 0 = 1")  # noqa: S608  (no values)


#: The longest SQLite's busy handler sleeps between two tries for a lock.
SQLITE_BUSY_POLL_S = 0.1


def make_way_for_writers(alias: str, held_s: float) -> None:
    """
    Between two batches of a bulk write that held the write lock ``held_s``
    seconds: on SQLite, pause that long, up to 100 ms. A writer waiting there
    for the lock (a lease renewal, a worker's step) is not queued: SQLite's
    busy handler sleeps and tries again, ever longer apart up to 100 ms, so a
    bulk write that began its next batch at once would keep it out for the
    whole selection and, past the busy timeout, fail it. A waiter's sleep is
    about as long as it has waited so far, so the pause lets in every writer
    that waited during the batch. Elsewhere waiters queue on row locks, and
    inside an outer transaction the lock is kept anyway: no pause.
    """
    pause = min(held_s, SQLITE_BUSY_POLL_S)
    connection = connections[alias]
    if pause > 0 and connection.vendor == "sqlite" and not connection.in_atomic_block:
        time.sleep(pause)


def now_params(connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """The ``now_dt`` parameter SQLite's statements take (see ``sql._NOW_DT``)."""
    if connection.vendor != "sqlite":
        return {}
    return {"now_dt": sqlite_now_text(connection)}


class _Shown:
    """A statement as Django's query log reads it from a psycopg cursor."""

    __slots__ = ("text",)

    def __init__(self, text: Any) -> None:
        self.text = text

    @property
    def query(self) -> bytes:
        return self.text.encode() if isinstance(self.text, str) else bytes(self.text)


#: A prepare threshold no statement count reaches: only ``prepare=True`` prepares.
_NEVER_BY_COUNT = 2**62


@functools.cache
def _preparing_cursor_class() -> type[Any]:
    import psycopg
    import psycopg.errors
    import psycopg.pq

    class PreparingCursor(psycopg.Cursor):
        """Binds on the server and prepares every statement it runs, once per connection."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            conn = self.connection
            if getattr(conn, "_pikku_unprepared", False):
                return super().execute(query, params, prepare=False, **kwargs)
            # Django opens connections with prepare_threshold=None, which turns
            # psycopg's preparing off for every cursor; lift it for this one
            # statement only, so Django's own statements stay unprepared.
            threshold = conn.prepare_threshold
            if threshold is None:
                conn.prepare_threshold = _NEVER_BY_COUNT
            try:
                return super().execute(query, params, prepare=True, **kwargs)
            except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement):
                # Behind a transaction-mode pooler (PgBouncer without
                # max_prepared_statements) the server session that knew the
                # statement is gone: this connection prepares nothing more.
                # Outside a transaction nothing was done: run it again
                # unprepared now. Inside one the server rolled it back, and
                # the error is a conflict (``conflicts.is_conflict``): the
                # whole transaction is sent again, unprepared.
                conn._pikku_unprepared = True  # type: ignore[attr-defined]
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raise
                return super().execute(query, params, prepare=False, **kwargs)
            finally:
                conn.prepare_threshold = threshold
                # What Django's query log shows (it reads ``_query``, which
                # psycopg leaves unset for a prepared statement).
                self._query = _Shown(query)  # type: ignore[assignment]

    return PreparingCursor


def prepares(connection: BaseDatabaseWrapper) -> bool:
    """
    Whether the hot statements are prepared on this connection: on PostgreSQL
    through psycopg 3, unless the project disabled preparing outright with
    ``OPTIONS["prepare_threshold"] = None``, or says it is behind a
    transaction-mode pooler with ``DISABLE_SERVER_SIDE_CURSORS`` (as Django
    asks of such a project) and does not opt in with a number as its
    ``prepare_threshold`` (PgBouncer's ``max_prepared_statements`` keeps them).
    Behind such a pooler another client's session may hold a statement of
    psycopg's name for another text, which nothing could tell apart.
    """
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return False
    options = connection.settings_dict.get("OPTIONS", {})
    if "prepare_threshold" in options:
        return options["prepare_threshold"] is not None
    return not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)


def model_from_row(model: type[M], alias: str, description: Any, row: tuple[Any, ...]) -> M:
    """An instance of ``model`` from a ``RETURNING *`` (or ``SELECT *``) row, converted as the ORM would."""
    names = tuple(column[0] for column in description)
    connection = connections[alias]
    fields, converters = _row_plan(model, alias, connection.vendor, names)
    values = list(row)
    for index, col, convert in converters:
        value = values[index]
        for converter in convert:
            value = converter(value, col, connection)
        values[index] = value
    if fields is None:
        return model.from_db(alias, [f.attname for f in model._meta.concrete_fields], values)
    # from_db takes the values in the model's field order, whatever the table's column order.
    by_name = dict(zip(names, values, strict=True))
    return model.from_db(alias, [name for name, _ in fields], [by_name[column] for _, column in fields])


@functools.lru_cache(maxsize=256)
def _row_plan(
    model: type[Model], alias: str, vendor: str, names: tuple[str, ...]
) -> tuple[list[tuple[str, str]] | None, list[tuple[int, Any, list[Any]]]]:
    """
    For rows of columns ``names``: the fields in model order as (attname,
    column), or None when the row is in that order already; and the
    converters of each column that has any.
    """
    connection = connections[alias]
    by_column = {field.column: field for field in model._meta.concrete_fields}
    converters = []
    for index, name in enumerate(names):
        field = by_column[name]
        col = field.cached_col
        convert = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if convert:
            converters.append((index, col, convert))
    ordered = [(f.attname, f.column) for f in model._meta.concrete_fields if f.column in names]
    in_order = len(names) == len(model._meta.concrete_fields) and [c for _, c in ordered] == list(names)
    return (None if in_order else ordered), converters


def read_models(model: type[M], alias: str, name: str, params: dict[str, Any]) -> list[M]:
    """The rows of the read ``name`` (``sql.STATEMENTS``) as instances of ``model``."""
    connection = connections[alias]
    with hot_cursor(connection) as cursor:
        cursor.execute(sql.statement(name, connection), params)
        rows = cursor.fetchall()
        description = cursor.description
    return [model_from_row(model, alias, description, row) for row in rows]


@contextmanager
def hot_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """
    A cursor for the guarded statements on the hot path. On PostgreSQL it binds
    on the server and prepares each statement once per connection, whatever
    cursor Django's settings choose: Django binds on the client and never
    prepares by default, so the server would parse and plan every lease and
    step statement afresh, which costs more than running it (bench/README.md).
    Its statements still pass through Django's cursor wrapper (execute
    wrappers, query logging, error translation). Elsewhere, Django's cursor.
    """
    if not prepares(connection):
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = _preparing_cursor_class()(connection.connection)
    wrapped = connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)
    with wrapped as cursor:
        yield cursor
