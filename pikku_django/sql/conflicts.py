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

Under SERIALIZABLE (PostgreSQL's 40001, InnoDB's deadlocks) any transaction
that reads what another one writes may be rolled back so: every runtime
transaction is one of its own (``in_transaction``) or a caller's, and is
sent again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many times a transaction is sent in all before its conflict is raised.
CONFLICT_TRIES = 8

#: The longest pause (seconds) before a transaction is sent again: the
#: pauses double from a few milliseconds up to it, each a random part of
#: its bound, so that many writers of one row (a fan-out's count, under
#: SERIALIZABLE) spread out rather than meet again (a third of a second at most in all).
CONFLICT_PAUSE_MAX_S = 0.1

#: MySQL/MariaDB: deadlock, lock wait timeout, and "failed to read
#: auto-increment value", which InnoDB answers when the wait for its
#: auto-increment lock ended in a deadlock or a timeout.
MYSQL_CONFLICTS = frozenset({1213, 1205, 1467})

#: PostgreSQL SQLSTATEs: serialization_failure, deadlock_detected,
#: lock_not_available; and invalid_sql_statement_name and
#: duplicate_prepared_statement, which a transaction-mode pooler answers when
#: the server session a prepared statement lived on is not the one the
#: transaction got (the cursor then prepares nothing more on that connection,
#: ``cursors.PreparingCursor``, and the transaction is sent again unprepared).
POSTGRESQL_CONFLICTS = frozenset({"40001", "40P01", "55P03", "26000", "42P05"})


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
    ``CONFLICT_TRIES`` in all, a random pause apart that doubles from a few
    milliseconds up to ``CONFLICT_PAUSE_MAX_S``) while the server
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
            # Apart by a random pause, so the writers don't meet again.
            bound = min(0.002 * 2**tries, CONFLICT_PAUSE_MAX_S)
            time.sleep(random.uniform(0, bound))  # noqa: S311  (not a secret)
    raise AssertionError("unreachable")  # pragma: no cover


def in_transaction(alias: str, write: Callable[[], T]) -> T:
    """
    ``write()`` in ``transaction.atomic(using=alias)``, sent again while the
    server rolls it back for a conflict (``retried``). Inside a caller's
    atomic block it is a savepoint of the caller's transaction, run once:
    only the caller can send its transaction again. ``write`` must start
    afresh on each call (whatever it counts or collects), and whatever it
    raises besides a conflict is raised as it is.
    """

    def once() -> T:
        with transaction.atomic(using=alias):
            return write()

    return retried(connections[alias], once)
