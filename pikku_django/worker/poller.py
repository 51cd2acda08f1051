"""
The one way every long-running loop of this app runs: a worker's lanes, its
sweep and scheduler, the PostgreSQL listener, and ``pikku_sweep --loop``.

A ``Poller`` calls its ``poll()`` until stopped. Between polls it waits on
its stop event or a wake-up (``pikku_django.wakeups``), so a signal or new
work ends the wait at once; a database outage is waited out with a capped
back-off, never a reason to exit; and connections the server dropped are
closed before each poll. A stop before start is safe, and so is a second stop.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, connections

from pikku_django import wakeups
from pikku_django.errors import DatabaseNotMigratedError, DatabaseUnavailableError
from pikku_django.outages import OUTAGE_ERRORS, Outage, drop_connections, raise_if_not_migrated
from pikku_django.sql.conflicts import is_conflict

logger = logging.getLogger(__name__)

#: Seconds before a loop that raised starts again (``Poller.restarts``);
#: doubled while it raises again before a poll succeeds, up to ``RESTART_MAX_S``.
RESTART_PAUSE_S = 1.0
RESTART_MAX_S = 30.0

#: Seconds a loop waits after a poll whose write met conflicts every time it was sent.
CONFLICT_PAUSE_S = 0.05

#: The clock every loop's ``phase`` is counted on.
SHARED_CLOCK = time.monotonic()


def refresh_connections() -> None:
    """
    Close connections the server dropped or that errors left unusable, as
    Django does around each request, so a long-lived loop never works on a
    dead one; keep healthy ones, whatever CONN_MAX_AGE says. A loop is not a
    request: with Django's default CONN_MAX_AGE of 0 it would otherwise
    reconnect (and lose its prepared statements) after every unit of work.
    Skipped while any connection is inside an atomic block (a test case's),
    which closing would break.
    """
    opened = connections.all(initialized_only=True)
    if any(conn.in_atomic_block for conn in opened):
        return
    for conn in opened:
        # close_at is when CONN_MAX_AGE would retire the connection; a loop's never retires.
        conn.close_at = None
        try:
            conn.close_if_unusable_or_obsolete()
        except DatabaseError:
            # Closing a connection the driver already knows dead may raise;
            # Django has let go of it all the same, and the next query reconnects.
            logger.debug("Closing a broken connection raised.", exc_info=True)


class Poller:
    """
    Runs ``poll()`` until stopped: again at once while it answers True (there
    was work), else after ``interval`` seconds or the next wake-up, whichever
    comes first. Subclasses add only ``poll()`` (and ``setup()``/``teardown()``
    if they hold something).
    """

    #: Seconds between polls that found nothing to do.
    interval: float = 1.0
    #: Whether a wake-up (new work made due in this process or announced by
    #: the database) ends the wait early.
    wakes: bool = True
    #: Seconds of outage after which the loop gives up (None: never).
    gives_up_after: float | None = None
    #: Where in each interval this loop's idle polls fall, in seconds from a
    #: clock shared by every loop of the process (None: ``interval`` after
    #: the last poll). Loops given phases spread over the interval take
    #: turns, so that together they look every ``interval / n``.
    phase: float | None = None
    #: Whether an error other than an outage restarts the loop (``run``)
    #: rather than ending it: so for every loop beside a worker's lanes.
    restarts: bool = False

    def __init__(
        self, name: str, *, stop: threading.Event | None = None, interval: float | None = None
    ) -> None:
        self.name = name
        self.stopping = stop if stop is not None else threading.Event()
        if interval is not None:
            self.interval = interval
        self.outage = Outage(name)
        self.error: BaseException | None = None
        #: Whether a poll succeeded since the loop last (re)started.
        self.polled = False
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """One unit of work; True if there may be more at once."""
        raise NotImplementedError

    def setup(self) -> None:
        """Before the first poll, on the loop's own thread."""

    def teardown(self) -> None:
        """After the last poll, on the loop's own thread; closes its connections."""
        connections.close_all()

    def finished(self) -> bool:
        """True once the loop should end by itself (``--once`` with nothing left)."""
        return False

    # -- running ---------------------------------------------------------------

    def run(self) -> None:
        """
        Poll until stopped (or ``finished()``), in the calling thread. A loop
        that ``restarts`` and raises is logged at WARNING and started again
        after a pause (doubling while it keeps raising, up to
        ``RESTART_MAX_S``), never left dead beside a worker that goes on.
        """
        pause = RESTART_PAUSE_S
        while True:
            self.polled = False
            try:
                self._run()
                return
            except DatabaseNotMigratedError:
                # Restarting will not create a table.
                raise
            except Exception as error:
                if not self.restarts or self.stopping.is_set():
                    raise
                pause = RESTART_PAUSE_S if self.polled else min(pause * 2, RESTART_MAX_S)
                logger.warning(
                    "%s raised %s: %s; restarting it in %.0f s.",
                    self.name,
                    type(error).__name__,
                    error,
                    pause,
                    exc_info=True,
                )
                if self.stopping.wait(pause):
                    return

    def _run(self) -> None:
        """``run``'s loop, once."""
        self.setup()
        try:
            seen = wakeups.generation()
            while not self.stopping.is_set() and not self.finished():
                refresh_connections()
                if self.outage.missed_one():
                    drop_connections()
                    self.outage.renewed()
                try:
                    busy = self.poll()
                except OUTAGE_ERRORS as error:
                    # The database went away (a restart, a failover): wait it
                    # out; a signal still ends the wait at once. A missing
                    # table is no outage: waiting will not create it.
                    raise_if_not_migrated(error)
                    if is_conflict(error):
                        # The database answered: it rolled a transaction back
                        # for a conflict, each time it was sent. No outage.
                        logger.warning(
                            "%s: a write met conflicts every time it was sent: %s", self.name, error
                        )
                        self.stopping.wait(CONFLICT_PAUSE_S)
                        continue
                    delay = self.outage.failed(error)
                    if self.gives_up_after is not None and self.outage.lasted >= self.gives_up_after:
                        raise DatabaseUnavailableError(self.outage.lasted, error) from error
                    self.stopping.wait(delay)
                    continue
                except DatabaseError as error:
                    raise_if_not_migrated(error)
                    raise
                self.outage.succeeded()
                self.polled = True
                if busy or self.stopping.is_set() or self.finished():
                    continue
                if self.wakes:
                    seen = wakeups.wait(seen, self.idle_wait(), self.stopping)
                else:
                    self.stopping.wait(self.idle_wait())
        finally:
            self.teardown()

    def idle_wait(self) -> float:
        """Seconds until the next idle poll: ``interval``, or to this loop's next turn (``phase``)."""
        if self.phase is None or self.interval <= 0:
            return self.interval
        into = (time.monotonic() - SHARED_CLOCK - self.phase) % self.interval
        return self.interval - into

    def start(self) -> None:
        """Run on a thread of its own."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run_logged, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to end after the unit in hand; safe before start and more than once."""
        self.stopping.set()
        wakeups.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; True once it has (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception as error:
            # Kept for whoever joins the thread (a worker ends with it).
            self.error = error
            logger.exception("%s ended with an error.", self.name)
