"""
A worker's name, held for as long as its process runs by a lock that lives
with a connection of its own, not a row: on PostgreSQL a transaction-level
advisory lock in a transaction that stays open on that connection, on
MySQL/MariaDB a ``GET_LOCK``, and on SQLite an exclusive ``flock`` on a
file beside nothing but the lock (the database is one host's file anyway).
A second live worker under the same name is refused. Holding it writes
nothing, so an idle worker's only statements are its looks; and a worker
that dies (even SIGKILLed) lets go of its name at once, where a lease would
hold it until it lapsed.

On PostgreSQL the lock is the transaction's, not the session's: behind a
transaction-mode pooler (PgBouncer) a session lock would stay with the
pooled server session after the worker died, and refuse its restart under
the same name; a transaction keeps its server session to itself and ends
with its client. The open transaction takes no snapshot between its
statements and writes nothing, so it holds back no vacuum.

A server restart ends the session and its lock: the worker's ``NameLoop``
notices (one ``SELECT 1`` every 30 s) and takes the lock again, or stops if
another worker took the name meanwhile.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from typing import IO, Any

from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)


def _digest(*parts: str, size: int) -> bytes:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=size, person=b"pikku-name").digest()


class NameLock:
    """The lock on the worker name ``name`` in the database ``alias`` (see the module docstring)."""

    def __init__(self, alias: str, name: str) -> None:
        self.alias = alias
        self.name = name
        self._connection: Any = None
        self._file: IO[bytes] | None = None

    @property
    def vendor(self) -> str:
        return str(connections[self.alias].vendor)

    def acquire(self) -> bool:
        """Take the lock; False if another live worker holds it. An outage raises, as a query would."""
        self.release()
        if self.vendor == "sqlite":
            return self._lock_file()
        connection = connections.create_connection(self.alias)
        # Made here, kept by the worker's NameLoop thread.
        connection.inc_thread_sharing()
        try:
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("BEGIN")
                cursor.execute(*self._lock_statement(connection))
                (got,) = cursor.fetchone()
        except BaseException:
            connection.close()
            raise
        if got != 1:
            connection.close()
            return False
        self._connection = connection
        return True

    def holds(self) -> bool:
        """Is the lock's session still there (one cheap read)? Always True for a file lock."""
        if self.vendor == "sqlite":
            # A file lock lasts as long as its process.
            return True
        if self._connection is None:
            return False
        try:
            with self._connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
        except DatabaseError:
            self.release()
            return False
        return True

    def release(self) -> None:
        """Let go of the lock (closing its session releases it on the server); safe more than once."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            try:
                connection.close()
            except DatabaseError:
                logger.debug("Closing the name lock's connection raised.", exc_info=True)
        if self._file is not None:
            file, self._file = self._file, None
            file.close()

    def _lock_statement(self, connection: Any) -> tuple[str, list[Any]]:
        database = str(connection.settings_dict["NAME"])
        if connection.vendor == "postgresql":
            key = int.from_bytes(_digest(self.name, size=8), "big", signed=True)
            return "SELECT pg_try_advisory_xact_lock(%s)", [key]
        # GET_LOCK names are server-wide and at most 64 characters.
        return "SELECT GET_LOCK(%s, 0)", ["pikku_worker_" + _digest(database, self.name, size=16).hex()]

    def _lock_file(self) -> bool:
        database = str(connections[self.alias].settings_dict["NAME"])
        if database == ":memory:" or "mode=memory" in database:
            # No other process sees this database: no other worker can share the name.
            return True
        path = os.path.join(
            tempfile.gettempdir(),
            "pikku-worker-" + _digest(os.path.abspath(database), self.name, size=16).hex() + ".lock",
        )
        file = open(path, "ab")  # noqa: SIM115  (kept open while the lock is held)
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            return False
        self._file = file
        return True
