"""
Wake-ups between processes of one host where the database carries none and
has no file that its commits change: MariaDB/MySQL. A commit that makes
work due (``wakeups.work_due``) appends a byte to a small file named after
the database; every worker process on the host watches it
(``watchers.FileWatcher``, a ``stat`` every 15 ms, no statement) and wakes
its lanes. A worker on another host still finds the work with its due look
(``watchers.DueLook``), so this only shortens a wait.

The file is no way in: it lives in a directory of the temporary directory
that only the process's user can write (``pikku-<uid>``, mode 0700, checked
to be a real directory of that user), and it is opened without following
symlinks and written only if it is a regular file of that user. Anything
else wakes nobody (the workers poll) and costs nothing else.

PostgreSQL needs none (NOTIFY), nor does SQLite (its database file changes
on every commit).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile

from django.db import connections

logger = logging.getLogger(__name__)

#: The file is cut back to nothing once it has grown to this many bytes.
MAX_BYTES = 1024


def wake_vendor(using: str) -> str:
    return str(connections[using].vendor)


def private_directory(path: str) -> str | None:
    """
    ``path``, made if missing (mode 0700): None unless it is a directory (not
    a symlink) of this process's user that no other user can write.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        logger.debug("Could not make the wake directory %s.", path, exc_info=True)
        return None
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        logger.debug("The wake directory %s is not this user's own; no wake file.", path)
        return None
    return path


def wake_file(using: str) -> str | None:
    """
    The wake file of database ``using``, or None where it needs none (or its
    directory is not this user's own). Every process of this user whose
    settings name the same server and database finds the same path.
    """
    vendor = wake_vendor(using)
    if vendor in ("postgresql", "sqlite"):
        return None
    folder = private_directory(os.path.join(tempfile.gettempdir(), f"pikku-{os.getuid()}"))
    if folder is None:
        return None
    settings = connections[using].settings_dict
    name = "|".join(str(settings.get(key) or "") for key in ("HOST", "PORT", "NAME"))
    digest = hashlib.sha256(f"{vendor}|{name}".encode()).hexdigest()[:20]
    return os.path.join(folder, f"pikku-wake-{digest}")


def touch(using: str) -> None:
    """Change ``using``'s wake file (once a commit made work due), if it has one."""
    path = wake_file(using)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
                return
            # Its size is what changes: two writes within one tick of the
            # file system's clock would leave its mtime as it was.
            if found.st_size >= MAX_BYTES:
                os.ftruncate(fd, 0)
            os.write(fd, b".")
        finally:
            os.close(fd)
    except OSError:
        logger.debug("Could not write the wake file %s.", path, exc_info=True)
