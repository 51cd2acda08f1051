"""What every store shares: the autocommit rule, SQLite's clock parameter, stored errors."""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Model, Q

from pikku_django.clock import sqlite_now_text
from pikku_django.errors import LeaseInTransactionError, RaisedBaseExceptionError

M = TypeVar("M", bound=Model)


def ensure_autocommit(connection: BaseDatabaseWrapper) -> None:
    """
    Refuse to run inside ``transaction.atomic()``: a lease written in an open
    transaction is invisible to other processes, and a rollback would hand its
    token out twice. The atomic blocks a Django ``TestCase`` wraps each test in
    are allowed, as ``atomic(durable=True)`` allows them.
    """
    if connection.in_atomic_block:
        if not getattr(connection.atomic_blocks[-1], "_from_testcase", False):
            raise LeaseInTransactionError(connection.alias)
    elif not connection.get_autocommit():
        raise LeaseInTransactionError(connection.alias)


FINISHED_RUN_STATUSES = ("completed", "failed", "cancelled")


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
    from pikku_django.models import LeaseTokenFloor

    table = connection.ops.quote_name(LeaseTokenFloor._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET token = token WHERE 0 = 1")  # noqa: S608  (no values)


def write_alias(model: type[Model], using: str | None) -> str:
    """
    The database a write of ``model`` goes to: ``using`` when given, else the
    router's ``db_for_write`` (never its ``db_for_read``: a replica refuses
    writes, and a read that decides a write must see the primary).
    """
    return using or router.db_for_write(model)


#: How many runs one transaction of a bulk action covers (cancelling or waking
#: a selection in the admin, ``WorkflowRunQuerySet.cancel()`` and ``wake()``).
#: Cancelling a run costs a handful of statements, so a batch holds SQLite's
#: write lock (row locks elsewhere) for a bounded time, and a lease renewal or
#: a worker's step gets in between two batches however large the selection.
BULK_BATCH_RUNS = 250


def batched(ids: Iterable[Any], size: int = BULK_BATCH_RUNS) -> Iterator[list[Any]]:
    """``ids`` in lists of at most ``size``, in order (``itertools.batched`` is Python 3.12+)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"batch_size: a batch holds at least one run, not {size!r}.")
    batch: list[Any] = []
    for item in ids:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


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


#: A run a worker may drive: running, or suspended on a wait that may time out.
ACTIVE_RUN_STATUSES = ("running", "suspended")

#: The ``wake_at`` of a run woken out of turn (by the admin, a sweep, or a step
#: that lost its worker): the epoch, so it is due at once *and* ahead of every
#: run that fell due in the ordinary way; a recovered run never waits behind a
#: backlog of fresh work.
WOKEN = 0

#: The lowest ``wake_at`` a bigint holds: the lower bound of the range of
#: runs woken out of turn (``not_queued()``).
MIN_WAKE_AT = -(2**63)

#: A step whose worker-loss budget is spent (the sweep asks it of running
#: steps under a lapsed lease): a workflow step on the last attempt its
#: current budget allows (``budget_base`` is the attempts spent before a
#: ``retry_workflow`` gave it a fresh one), a task's step once its losses
#: reach ``worker_losses`` (see ``WorkflowStep.is_exhausted``).
SPENT = Q(worker_losses__isnull=True, attempt__gte=F("budget_base") + F("retries") + 1) | Q(
    worker_losses__isnull=False, losses__gte=F("worker_losses")
)

#: The sweep's back-off between two wakes of one idle run: 30 s, doubling to 10 min.
SWEEP_BACKOFF_MS = (30_000, 60_000, 120_000, 240_000, 480_000)
SWEEP_BACKOFF_MAX_MS = 600_000


def now_params(connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """The ``now_dt`` parameter SQLite's statements take (see ``sql._NOW_DT``)."""
    if connection.vendor != "sqlite":
        return {}
    return {"now_dt": sqlite_now_text(connection)}


def serialize_error(error: BaseException) -> dict[str, Any]:
    """
    An exception as the JSON stored on a failed step or run (a carried
    ``SystemExit`` or ``KeyboardInterrupt`` as itself): its message and
    traceback with NUL characters removed (PostgreSQL's jsonb cannot store
    them) and bounded in size, so recording a failure never fails on them.
    """
    if isinstance(error, RaisedBaseExceptionError):
        error = error.original
    cls = type(error)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": _bounded(_message(error), MAX_ERROR_MESSAGE_CHARS),
        "traceback": _bounded("".join(traceback.format_exception(error)), MAX_TRACEBACK_CHARS),
    }


#: How much of an error's message and traceback is stored (the traceback's
#: end, where the error was raised, is kept).
MAX_ERROR_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 64_000


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # an error whose __str__ raises is still recorded
        return f"<{type(error).__qualname__}: its message could not be read>"


def _bounded(text: str, limit: int) -> str:
    """
    ``text`` without NUL characters or lone surrogates (no database stores
    them), cut to ``limit`` characters around an elision mark.
    """
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if len(text) <= limit:
        return text
    mark = f"\n[... {len(text) - limit} characters left out ...]\n"
    head = limit // 4
    return text[:head] + mark + text[len(text) - (limit - head) :]


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
                # statement is gone. Outside a transaction nothing was done:
                # run it unprepared, and never prepare on this connection again.
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raise
                conn._pikku_unprepared = True  # type: ignore[attr-defined]
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
    ``OPTIONS["prepare_threshold"] = None`` (say, behind a transaction-mode
    pooler that cannot keep prepared statements).
    """
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return False
    options = connection.settings_dict.get("OPTIONS", {})
    return not ("prepare_threshold" in options and options["prepare_threshold"] is None)


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
    from pikku_django import sql

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
