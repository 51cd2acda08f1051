"""
How other processes hear of new work, per vendor: PostgreSQL's NOTIFY (sent
in the committing transaction, heard by a worker's ``Listener``); SQLite's
database file and MariaDB's host wake file (``wake_files``), which a
worker's watchers stat; and, where only a look can tell (MariaDB across
hosts), a due look that polls for the lanes.
"""

from __future__ import annotations

import uuid

from django.db import connections

from pikku_django.sql.wake_files import wake_file

#: The channel every commit that makes work due notifies.
CHANNEL = "pikku_work"


def carries_notifications(using: str) -> bool:
    """True where the database delivers NOTIFY to other connections (PostgreSQL)."""
    return connections[using].vendor == "postgresql"


def announce(using: str) -> None:
    """Send the NOTIFY within the transaction in progress (delivered when it commits)."""
    if not carries_notifications(using):
        return
    with connections[using].cursor() as cursor:
        # Identical notifications of one transaction are delivered once.
        cursor.execute(f"NOTIFY {CHANNEL}")


def watched_files(using: str) -> list[str]:
    """
    The files whose change says another process on this host made work due:
    SQLite's database file and its ``-wal`` (none for an in-memory database,
    never shared with another process), MariaDB's wake file; none on
    PostgreSQL, whose NOTIFY says it.
    """
    conn = connections[using]
    if conn.vendor == "sqlite":
        path = sqlite_file(using)
        return [] if path is None else [path, f"{path}-wal"]
    path = wake_file(using)
    return [] if path is None else [path]


def looks_for_lanes(using: str) -> bool:
    """True where a worker's due look polls for its lanes (other hosts' work: MySQL/MariaDB)."""
    return connections[using].vendor == "mysql"


def sqlite_file(using: str) -> str | None:
    """The SQLite database file of ``using`` that other processes write, or None."""
    conn = connections[using]
    if conn.vendor != "sqlite":
        return None
    name = str(conn.settings_dict["NAME"] or "")
    # In memory (":memory:", or a URI "file:...?mode=memory", which Django's
    # test databases use): no other process sees it. Other URI filenames are
    # left to the lanes' polls too.
    return None if name in ("", ":memory:") or name.startswith("file:") else name


#: The channel a commit that changes what a run tells its readers notifies
#: (its end, an event, a stream item), with the run's id as the payload.
RESULTS_CHANNEL = "pikku_results"


def announce_results(using: str, run_id: object) -> None:
    """
    Within the transaction in progress: tell the readers waiting on the run
    (``workflows.waiting``) once it commits. PostgreSQL only; elsewhere
    readers poll.
    """
    if not carries_notifications(using):
        return
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [RESULTS_CHANNEL, run_key(run_id)])


def run_key(run_id: object) -> str:
    """The payload that names a run: its id as a dashed UUID (as given when it is no UUID)."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        return str(run_id)
