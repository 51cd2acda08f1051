"""What every store shares: the autocommit rule, SQLite's clock parameter, stored errors."""

from __future__ import annotations

import datetime
import traceback
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

#: A step on its last allowed attempt (its worker-loss budget is spent).
SPENT = Q(attempt__gte=F("retries") + 1)

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
