"""
Transactions the server rolled back for a conflict between two writers (a
deadlock, a lock wait that timed out, a serialization failure), and running
them again.

A worker's lanes write the same tables at once: on MySQL/MariaDB two lanes
inserting attempt rows side by side can deadlock on InnoDB's auto-increment
lock and the unique index, which the server settles by rolling one of them
back. That transaction wrote nothing, and every write of this app is
guarded, so sending it again is safe and almost always succeeds. Such an
error is not an outage: the database is there, and waiting it out (with the
pass's held outcome lost and its run stalled until its lease lapses) is the
wrong answer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many times a transaction is sent in all before its conflict is raised.
CONFLICT_TRIES = 5

#: MySQL/MariaDB: deadlock, lock wait timeout, and "failed to read
#: auto-increment value", which InnoDB answers when the wait for its
#: auto-increment lock ended in a deadlock or a timeout.
MYSQL_CONFLICTS = frozenset({1213, 1205, 1467})

#: PostgreSQL SQLSTATEs: serialization_failure, deadlock_detected, lock_not_available.
POSTGRESQL_CONFLICTS = frozenset({"40001", "40P01", "55P03"})


def is_conflict(error: BaseException) -> bool:
    """Did the server roll back ``error``'s transaction for a conflict with another writer?"""
    for cause in (error, error.__cause__):
        if cause is None:
            continue
        sqlstate = getattr(cause, "sqlstate", None)
        if sqlstate in POSTGRESQL_CONFLICTS:
            return True
        args = getattr(cause, "args", ())
        if args and isinstance(args[0], int) and args[0] in MYSQL_CONFLICTS:
            return True
    return False


def retried(connection: BaseDatabaseWrapper, write: Callable[[], T], *, within: bool = False) -> T:
    """
    ``write()``, one transaction of its own, sent again (up to
    ``CONFLICT_TRIES`` in all, a few milliseconds apart) while the server
    rolls it back for a conflict. ``within``, or inside an atomic block, it
    is part of a caller's transaction, which only the caller can send again:
    it runs once.
    """
    if within or connection.in_atomic_block:
        return write()
    for tries in range(1, CONFLICT_TRIES + 1):
        try:
            return write()
        except DatabaseError as error:
            if tries == CONFLICT_TRIES or not is_conflict(error):
                raise
            logger.debug("A write met a conflict (%s); sending it again.", error)
            # Apart by a random few milliseconds, so the two writers don't meet again.
            time.sleep(random.uniform(0, 0.002 * tries))  # noqa: S311  (not a secret)
    raise AssertionError("unreachable")  # pragma: no cover
