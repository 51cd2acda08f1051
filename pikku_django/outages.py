"""
Waiting out a database that went away (a restart, a failover): which errors
say so, and the capped back-off that long-running loops wait with instead of
exiting.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import InterfaceError, OperationalError, connections

from pikku_django.errors import DatabaseNotMigratedError
from pikku_django.sql.schema import is_undefined_table

logger = logging.getLogger(__name__)

#: What a database that is restarting, failing over or out of reach raises:
#: refused or dropped connections, "the database system is shutting down",
#: "server has gone away". Errors that say the SQL or the schema is wrong
#: (ProgrammingError, IntegrityError) are not an outage and are not waited out.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

#: How long ``pikku_worker --once`` waits for a database that is out of reach
#: before it gives up (exit 1), so that runs under cron never pile up.
ONCE_GIVES_UP_AFTER_S = 60.0


def is_schema_error(error: BaseException) -> bool:
    """
    True when ``error`` says a table is missing (the schema was never
    migrated, which waiting will not mend) rather than the database
    unreachable: decided from the server's code (``sql.schema``).
    """
    return is_undefined_table(error)


def raise_if_not_migrated(error: BaseException) -> None:
    """Raise ``DatabaseNotMigratedError`` (from ``error``) when ``error`` says a table is missing."""
    if is_schema_error(error):
        raise DatabaseNotMigratedError(error) from error


#: The first wait after a failure, doubling up to the cap.
FIRST_DELAY = 0.1
MAX_DELAY = 5.0


def drop_connections() -> None:
    """
    Close this thread's connections so the next query reconnects. A connection
    inside an atomic block (a test case's) is left alone: closing it would
    break the block.
    """
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            continue
        try:
            conn.close()
        except Exception:  # noqa: S112  (a broken connection may fail to close; it is dropped anyway)
            continue


class Outage:
    """
    One loop's view of the database's availability: each failure returns how
    long to wait before trying again (0.1 s doubling to 5 s). The outage is
    logged once per process, however many loops (lanes, the sweep, the
    listener...) meet it: by the first loop that fails, and its end by the
    first loop that gets through again, with how long it lasted.
    """

    #: When this process's outage began, as the first loop to fail saw it.
    _process_started: float | None = None
    #: When this process's last outage ended, as the first loop through saw it.
    _process_ended: float | None = None
    _lock = threading.Lock()

    def __init__(self, name: str) -> None:
        self.name = name
        self.started: float | None = None
        self.failures = 0
        self._delay = FIRST_DELAY
        # When this loop last got through (or made its connections anew).
        self._fresh = time.monotonic()

    def missed_one(self) -> bool:
        """
        Did an outage begin and end while this loop waited (a scheduler asleep
        between ticks)? Its connections may be ones the server dropped: the
        loop makes them anew before it polls (``renewed()``), rather than
        meeting the outage after it ended, as an outage of its own.
        """
        ended = Outage._process_ended
        return ended is not None and self._fresh < ended

    def renewed(self) -> None:
        """This loop's connections were made anew."""
        self._fresh = time.monotonic()

    @property
    def ongoing(self) -> bool:
        return self.started is not None

    @property
    def lasted(self) -> float:
        """Seconds since this loop first failed (0 when there is no outage)."""
        return 0.0 if self.started is None else time.monotonic() - self.started

    def failed(self, error: BaseException) -> float:
        """Note a failure; returns the seconds to wait before the next try."""
        if self.started is None:
            self.started = time.monotonic()
            self._delay = FIRST_DELAY
            with Outage._lock:
                first = Outage._process_started is None
                if first:
                    Outage._process_started = self.started
            log = logger.warning if first else logger.debug
            log(
                "%s: the database is unavailable (%s: %s); retrying with a back-off of up to %g s.",
                self.name,
                type(error).__name__,
                # One line: a driver's message may run over several.
                " ".join(str(error).split()) or "no message",
                MAX_DELAY,
            )
        self.failures += 1
        drop_connections()
        delay = self._delay
        self._delay = min(self._delay * 2, MAX_DELAY)
        return delay

    def succeeded(self) -> None:
        """Note a success; ends the outage, if there was one."""
        self._fresh = time.monotonic()
        if self.started is None:
            return
        with Outage._lock:
            began, Outage._process_started = Outage._process_started, None
            if began is not None:
                Outage._process_ended = self._fresh
        log = logger.warning if began is not None else logger.debug
        log(
            "%s: the database is back after %.1f s (%s failed tries).",
            self.name,
            time.monotonic() - (began if began is not None else self.started),
            self.failures,
        )
        self.started = None
        self.failures = 0
