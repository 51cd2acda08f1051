"""SQLite: the portable form (``base.Driver``). Its writers are serialised by the database's write lock."""

from __future__ import annotations

from pathlib import Path

from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django.sql.drivers.base import Driver


class SQLiteDriver(Driver):
    """Each write is its statement and its history row in one short transaction."""

    def missing_database(self, connection: BaseDatabaseWrapper, error: BaseException | None) -> bool:
        # Asked before connecting: SQLite would create a missing file (an
        # empty database), and cannot open one in a missing directory.
        name = str(connection.settings_dict["NAME"])
        if connection.is_in_memory_db() or name.startswith("file:"):  # type: ignore[attr-defined]
            return False
        return not Path(name).exists()
