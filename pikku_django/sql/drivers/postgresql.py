"""
PostgreSQL: a step's write and its attempt's history row are one statement
(data-modifying CTEs, see ``sql.POSTGRESQL_STEP_*``), atomic on its own, so
no transaction is opened around it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql
from pikku_django.sql import schema
from pikku_django.sql.drivers.base import Driver, PassEnd, StepFromRow, done_params

if TYPE_CHECKING:
    from pikku_django.models import WorkflowStep


class PostgreSQLDriver(Driver):
    ends_passes = True

    def missing_database(self, connection: BaseDatabaseWrapper, error: BaseException | None) -> bool:
        if error is None:
            return False
        code = schema.sqlstate(error)
        if code is not None:
            return code == schema.POSTGRESQL_INVALID_CATALOG
        # libpq gives a failed connection no SQLSTATE: ask the server's
        # catalogue, through its maintenance database, as Django's
        # ``createdb`` does. A server out of reach answers nothing: no verdict.
        try:
            with warnings.catch_warnings():
                # Django warns when it falls back from the maintenance database.
                warnings.simplefilter("ignore")
                with connection._nodb_cursor() as cursor:
                    cursor.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", [connection.settings_dict["NAME"]]
                    )
                    return cursor.fetchone() is None
        except Exception:  # noqa: BLE001 (an outage, or no right to the maintenance database)
            return False

    def end_pass(
        self, connection: BaseDatabaseWrapper, cursor: Any, name: str, params: dict[str, Any]
    ) -> PassEnd:
        # One statement (sql.ends): the run's end stored, when it matched.
        cursor.execute(sql.statement(name, connection), params)
        finished, released, updated_at = cursor.fetchone()
        ended = (cursor.description[2:], (updated_at,)) if updated_at is not None else False
        return finished == 1, ended, released == 1

    def start_step(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> bool:
        cursor.execute(sql.statement("step_start", connection), params)
        return cursor.fetchone() is not None

    def handoff(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], done: dict[str, Any]
    ) -> tuple[bool, bool]:
        # One statement (sql.POSTGRESQL_STEP_HANDOFF).
        cursor.execute(sql.statement("step_handoff", connection), {**params, **done_params(done)})
        matched, inserted = cursor.fetchone()
        return matched == 1, inserted == 1

    def claim_attempt(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> int | None:
        cursor.execute(sql.statement("step_claim_attempt", connection), params)
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def claim_step(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        params: dict[str, Any],
        from_row: StepFromRow,
        *,
        within: bool = False,
    ) -> WorkflowStep | None:
        # The claim and its history row are one statement (sql.POSTGRESQL_STEP_CLAIM).
        cursor.execute(sql.statement("step_claim", connection), params)
        row = cursor.fetchone()
        return None if row is None else from_row(cursor.description, row)

    def write_finish(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool
    ) -> bool:
        cursor.execute(sql.statement("step_finish", connection), params)
        return cursor.fetchone() is not None
