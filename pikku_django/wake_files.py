"""
Wake-ups between processes of one host where the database carries none and
has no file that its commits change: MariaDB/MySQL. A commit that makes
work due (``wakeups.work_due``) appends a byte to a small file named after
the database, in the temporary directory; every worker process on the host
watches it (``watchers.FileWatcher``, a ``stat`` every 15 ms, no statement)
and wakes its lanes. A worker on another host still finds the work with its
due look (``watchers.DueLook``), so this only shortens a wait.

PostgreSQL needs none (NOTIFY), nor does SQLite (its database file changes
on every commit). A file that cannot be written (another user's, a
read-only directory) wakes nobody and costs nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile

from django.db import connections

logger = logging.getLogger(__name__)

#: The file is cut back to nothing once it has grown to this many bytes.
MAX_BYTES = 1024


def wake_file(using: str) -> str | None:
    """
    The wake file of database ``using``, or None where it needs none. Every
    process whose settings name the same server and database finds the same
    path.
    """
    conn = connections[using]
    if conn.vendor in ("postgresql", "sqlite"):
        return None
    settings = conn.settings_dict
    name = "|".join(str(settings.get(key) or "") for key in ("HOST", "PORT", "NAME"))
    digest = hashlib.sha256(f"{conn.vendor}|{name}".encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"pikku-wake-{digest}")


def touch(using: str) -> None:
    """Change ``using``'s wake file (once a commit made work due), if it has one."""
    path = wake_file(using)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            # Its size is what changes: two writes within one tick of the
            # file system's clock would leave its mtime as it was.
            if os.fstat(fd).st_size >= MAX_BYTES:
                os.ftruncate(fd, 0)
            os.write(fd, b".")
        finally:
            os.close(fd)
    except OSError:
        logger.debug("Could not write the wake file %s.", path, exc_info=True)
