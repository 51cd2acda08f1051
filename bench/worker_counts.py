"""
Imported by the worker processes bench/task_targets.py starts: the no-op
tasks of bench/noop_tasks.py, and, when ``BENCH_COUNTS`` names a file, a
count of what the process sends to its database, kept in the process.

Every Django connection the process opens (one per lane, the sweep's, the
scheduler's, the keeper's) gets an ``execute_wrapper`` that counts its
statements by kind (``select``; ``write``: an INSERT/UPDATE/DELETE/REPLACE
that changed rows, or sent in a batch whose row count is unknown;
``unchanged``: one that changed no row, like the guarded take of a run
another lane took first (one with RETURNING counts as a write: SQLite
knows its row count only once its rows are read); ``probe``: one that matches no row by
construction, SQLite's write-lock probe ``WHERE 0 = 1``; ``begin``;
``other``) and its durable commits, as tests/worker/test_task_commits.py counts
them, except that a write which changed nothing is none (it logs nothing):
a COMMIT that ends a transaction which wrote (Django's ``atomic()``, which
commits through ``connection.commit()``, or a ``START TRANSACTION`` …
``COMMIT`` sent as statements), or a write run in autocommit. BEGIN/COMMIT that Django sends
through the driver (not a cursor) are not statements here; a commit is.

On SIGUSR1 and at exit the totals so far are appended to the file as one
JSON line, so that the bench can take the difference of two snapshots;
``commits_by`` counts the commits by the tables each one wrote, in order,
``unchanged_by`` the writes that changed nothing, by verb and table.
The PostgreSQL wake-up listener's own connection (a raw psycopg
connection, outside Django's cursors) is not counted: it only waits.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

import bench.noop_tasks  # noqa: F401  (the tasks the worker runs)

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
_BEGIN = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
_END = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
#: SQLite counts the rows of an UPDATE … RETURNING only once they are all read.
_RETURNING = re.compile(r"\bRETURNING\b", re.IGNORECASE)
_NO_ROWS = re.compile(r"WHERE\s+0\s*=\s*1", re.IGNORECASE)
_SELECT = re.compile(r"^\s*\(?\s*(SELECT|SHOW|WITH\b(?!.*\b(INSERT|UPDATE|DELETE)\b))", re.IGNORECASE | re.S)

_TABLE = re.compile(r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM|REPLACE\s+INTO)\s+([`\"\w]+)", re.I)
#: Every write of a statement with a WITH list (its CTEs' and its own); not ON CONFLICT's DO UPDATE.
_ANY_WRITE = re.compile(r"(?<!DO )\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([`\"\w]+)", re.I)

_lock = threading.Lock()
_totals: dict[str, int] = {
    "select": 0,
    "write": 0,
    "unchanged": 0,
    "probe": 0,
    "begin": 0,
    "other": 0,
    "commit": 0,
}
#: Durable commits by what they wrote: "INSERT pikku_lease, UPDATE pikku_run" (tables in order).
_commits_by: dict[str, int] = {}
#: Writes that changed no row, by verb and table.
_unchanged_by: dict[str, int] = {}


def _add(kind: str) -> None:
    with _lock:
        _totals[kind] += 1


def _commit(writes: list[str]) -> None:
    key = ", ".join(writes)
    with _lock:
        _totals["commit"] += 1
        _commits_by[key] = _commits_by.get(key, 0) + 1


def _short(text: str) -> str:
    """A write as its verb and table: ``UPDATE pikku_run``."""
    found = _TABLE.match(text)
    if found is None and text.lstrip()[:4].upper() == "WITH":
        parts = [_name(verb, table) for verb, table in _ANY_WRITE.findall(text)]
        return "WITH: " + " + ".join(parts)
    if found is None:
        return " ".join(text.split())[:40]
    return _name(found.group(1), found.group(2))


def _name(verb: str, table: str) -> str:
    return verb.split()[0].upper() + " " + table.strip('`"')


class _Connection:
    """The counting state of one Django connection (one thread's)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.explicit = False
        self.writes: list[str] = []

    def in_transaction(self) -> bool:
        return self.explicit or self.connection.in_atomic_block or not self.connection.get_autocommit()

    def statement(self, text: str, rows: int) -> None:
        if _BEGIN.match(text):
            _add("begin")
            self.explicit, self.writes = True, []
        elif _END.match(text):
            _add("other")
            if text.lstrip().upper().startswith("COMMIT") and self.writes:
                _commit(self.writes)
            self.explicit, self.writes = False, []
        elif _WRITES.search(text) and not _SELECT.match(text):
            if _NO_ROWS.search(text):
                _add("probe")
                return
            if rows == 0 and not _RETURNING.search(text):
                # It changed no row: no commit of its own (on PostgreSQL an
                # INSERT … ON CONFLICT DO UPDATE still locks the row it met,
                # which the log shows and this count does not).
                _add("unchanged")
                with _lock:
                    _unchanged_by[_short(text)] = _unchanged_by.get(_short(text), 0) + 1
                return
            _add("write")
            if self.in_transaction():
                self.writes.append(_short(text))
            else:
                _commit([_short(text)])
        elif _SELECT.match(text):
            _add("select")
        else:
            _add("other")

    def execute(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        rows = -1
        try:
            result = execute(sql, params, many, context)
            rows = getattr(context.get("cursor"), "rowcount", -1)
            return result
        finally:
            # MySQL/MariaDB send a transaction's statements in one round trip
            # (whose row count is not one statement's).
            parts = [part for part in str(sql).split(";\n") if part.strip()]
            for part in parts:
                self.statement(part, rows if len(parts) == 1 else -1)

    def committed(self) -> None:
        if self.writes:
            _commit(self.writes)
        self.explicit, self.writes = False, []


def _on_connect(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    # The wrapper object outlives a reconnect: count through it once.
    if getattr(connection, "_bench_counts", None) is None:
        state = _Connection(connection)
        connection._bench_counts = state  # type: ignore[attr-defined]
        connection.execute_wrappers.append(state.execute)


def _dump(path: str) -> None:
    with _lock:
        line = json.dumps({**_totals, "commits_by": _commits_by, "unchanged_by": _unchanged_by})
    with open(path, "a") as out:
        out.write(line + "\n")


def install(path: str) -> None:
    connection_created.connect(_on_connect, weak=False)
    real_commit = BaseDatabaseWrapper.commit

    def commit(self: BaseDatabaseWrapper) -> None:
        state = getattr(self, "_bench_counts", None)
        if state is not None:
            state.committed()
        real_commit(self)

    BaseDatabaseWrapper.commit = commit  # type: ignore[method-assign]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _dump(path)

    signal.signal(signal.SIGUSR1, on_signal)
    atexit.register(_dump, path)


if os.environ.get("BENCH_COUNTS"):
    install(os.environ["BENCH_COUNTS"])
