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

``names_held`` tells which names live workers hold now, without taking any
(the admin's Workers page, the heartbeat's pruning, ``pikku_workers_live``):
on PostgreSQL one read of ``pg_locks``, on MySQL/MariaDB one ``SELECT`` of
``IS_USED_LOCK`` per name, on SQLite a shared ``flock`` tried on each
name's file (never made).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterable
from typing import IO, Any

from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)


#: Tries of a file lock taken while another process may be looking at it
#: (``names_held``'s shared lock lasts microseconds), and the pause between them.
FILE_LOCK_TRIES = 5
FILE_LOCK_PAUSE_S = 0.01

#: Worker names held by this process on in-memory SQLite databases, by alias
#: (no other process sees such a database, so no file is needed).
_HELD_IN_MEMORY: set[tuple[str, str]] = set()


def _digest(*parts: str, size: int) -> bytes:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=size, person=b"pikku-name").digest()


def _advisory_key(name: str) -> int:
    """The PostgreSQL advisory lock key (a signed 64-bit integer) of the worker name ``name``."""
    return int.from_bytes(_digest(name, size=8), "big", signed=True)


def _server_lock_name(connection: Any, name: str) -> str:
    """The MySQL/MariaDB ``GET_LOCK`` name (server-wide, at most 64 characters) of ``name``."""
    database = str(connection.settings_dict["NAME"])
    return "pikku_worker_" + _digest(database, name, size=16).hex()


def _in_memory(alias: str) -> bool:
    database = str(connections[alias].settings_dict["NAME"])
    return database == ":memory:" or "mode=memory" in database


def _lock_path(alias: str, name: str) -> str:
    """The file whose ``flock`` holds the worker name ``name`` of the SQLite database ``alias``."""
    database = str(connections[alias].settings_dict["NAME"])
    return os.path.join(
        tempfile.gettempdir(),
        "pikku-worker-" + _digest(os.path.abspath(database), name, size=16).hex() + ".lock",
    )


def names_held(alias: str, names: Iterable[str]) -> set[str]:
    """
    Which of the worker ``names`` a live worker holds now in the database
    ``alias`` (its ``NameLock``): one query on a server whatever the number
    of names, none on SQLite. A name this process holds counts too.
    """
    wanted = sorted(set(names))
    if not wanted:
        return set()
    connection = connections[alias]
    if connection.vendor == "sqlite":
        return {name for name in wanted if _file_held(alias, name)}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            keys = {_advisory_key(name): name for name in wanted}
            # A bigint key shows as classid (its high half) and objid (its low half), objsubid 1.
            key = "((l.classid::bigint << 32) | l.objid::bigint)"
            cursor.execute(
                f"SELECT DISTINCT {key} FROM pg_locks l"
                " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
                " AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())"
                f" AND {key} IN ({', '.join(['%s'] * len(keys))})",
                list(keys),
            )
            return {keys[int(found)] for (found,) in cursor.fetchall()}
        locks = [_server_lock_name(connection, name) for name in wanted]
        cursor.execute("SELECT " + ", ".join(["IS_USED_LOCK(%s)"] * len(locks)), locks)
        row = cursor.fetchone()
    return {name for name, user in zip(wanted, row, strict=True) if user is not None}


def _file_held(alias: str, name: str) -> bool:
    """Is the lock file of ``name`` locked by a live worker (this process's included)? Makes no file."""
    if _in_memory(alias):
        return (alias, name) in _HELD_IN_MEMORY
    try:
        file = open(_lock_path(alias, name), "rb")  # noqa: SIM115  (closed below)
    except FileNotFoundError:
        return False
    except PermissionError:
        # Another user's worker made it: it cannot be looked at, so it is not judged gone.
        return True
    with file:
        try:
            # flock conflicts between open files, even of one process: this
            # process's own lock is found held. Closing the file lets go.
            fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


class NameLock:
    """The lock on the worker name ``name`` in the database ``alias`` (see the module docstring)."""

    def __init__(self, alias: str, name: str) -> None:
        self.alias = alias
        self.name = name
        self._connection: Any = None
        self._file: IO[bytes] | None = None
        self._in_memory = False

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
        if self._in_memory:
            self._in_memory = False
            _HELD_IN_MEMORY.discard((self.alias, self.name))

    def _lock_statement(self, connection: Any) -> tuple[str, list[Any]]:
        if connection.vendor == "postgresql":
            return "SELECT pg_try_advisory_xact_lock(%s)", [_advisory_key(self.name)]
        return "SELECT GET_LOCK(%s, 0)", [_server_lock_name(connection, self.name)]

    def _lock_file(self) -> bool:
        if _in_memory(self.alias):
            # No other process sees this database: only this one's workers can share the name.
            key = (self.alias, self.name)
            if key in _HELD_IN_MEMORY:
                return False
            _HELD_IN_MEMORY.add(key)
            self._in_memory = True
            return True
        file = open(_lock_path(self.alias, self.name), "ab")  # noqa: SIM115  (kept open while held)
        for attempt in range(FILE_LOCK_TRIES):
            if attempt:
                # Held, or only looked at by ``names_held`` for a moment: try again shortly.
                time.sleep(FILE_LOCK_PAUSE_S)
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            self._file = file
            return True
        file.close()
        return False
