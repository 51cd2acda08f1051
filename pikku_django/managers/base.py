"""What every store shares: the autocommit rule, SQLite's clock parameter, stored errors."""

from __future__ import annotations

import datetime
import functools
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Q

from pikku_django.errors import LeaseInTransactionError


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

#: The ``wake_at`` of a run woken out of turn (by the admin, a sweep, or a step
#: that lost its worker): the epoch, so it is due at once *and* ahead of every
#: run that fell due in the ordinary way; a recovered run never waits behind a
#: backlog of fresh work.
WOKEN = 0

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
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"now_dt": connection.ops.adapt_datetimefield_value(now)}


def serialize_error(error: BaseException) -> dict[str, Any]:
    """An exception as the JSON stored on a failed step or run."""
    cls = type(error)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }


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

    class PreparingCursor(psycopg.Cursor):
        """Binds on the server and prepares every statement it runs, once per connection."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            # Django opens connections with prepare_threshold=None, which turns
            # psycopg's preparing off for every cursor; lift it for this one
            # statement only, so Django's own statements stay unprepared.
            conn = self.connection
            threshold = conn.prepare_threshold
            if threshold is None:
                conn.prepare_threshold = _NEVER_BY_COUNT
            try:
                return super().execute(query, params, prepare=True, **kwargs)
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
