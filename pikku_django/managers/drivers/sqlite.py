"""SQLite: the portable form (``base.Driver``). Its writers are serialised by the database's write lock."""

from __future__ import annotations

from pikku_django.managers.drivers.base import Driver


class SQLiteDriver(Driver):
    """Each write is its statement and its history row in one short transaction."""
