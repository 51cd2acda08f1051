"""
The portable driver: each guarded write is its statement and, for a step,
the attempt's history row, in one short transaction (SQLite runs it so; the
other vendors fold the two into fewer round trips, see their drivers).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql
from pikku_django.sql.batches import one_transaction
from pikku_django.sql.cursors import now_params

if TYPE_CHECKING:
    from pikku_django.models import Lease, WorkflowStep

#: What a pass's end answered (``Driver.end_pass``): whether the step's
#: outcome matched; the run's, as (description, row) of the end it stored
#: where the vendor returns it, else whether it matched; whether the release
#: matched.
PassEnd = tuple[bool, "tuple[Any, tuple[Any, ...]] | bool", bool]

#: What a take got (``Driver.take_run``): the run's row as the take left it
#: (description, row), and, where the driver takes the run lease with it
#: (``takes_run_leases``), the lease's row as its upsert left it (key,
#: holder, token, expires_at; the take's when the holder is), else None.
Taken = tuple[Any, tuple[Any, ...], "tuple[Any, ...] | None"]

#: Builds a step from a ``RETURNING *`` row: (description, row) -> step.
StepFromRow = Callable[[Any, tuple[Any, ...]], "WorkflowStep"]


class Driver:
    """Runs one vendor's guarded statements and reads their answers (see ``managers.drivers``)."""

    #: Does ``end_pass`` fold a pass's end into one statement or round trip?
    ends_passes = False

    # -- leases -----------------------------------------------------------------------

    def refreshed(self, cursor: Any, lease: Lease) -> tuple[Any, ...] | None:
        """After ``lease_refresh`` ran: the renewed row (key, holder, token, expiry), or None."""
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row

    # -- the database itself ---------------------------------------------------------------

    def missing_database(self, connection: BaseDatabaseWrapper, error: BaseException | None) -> bool:
        """
        Does ``connection``'s database not exist? Asked before the first
        connection (``error`` None) and after it failed with ``error``.
        """
        return False

    # -- runs -------------------------------------------------------------------------

    def takes_run_leases(self, connection: BaseDatabaseWrapper) -> bool:
        """Does ``take_run`` acquire the run lease too, in the take's own round trip?"""
        return False

    def take_run(self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any]) -> Taken | None:
        """
        A worker's take of the due run ``run_id`` whose ``wake_at`` was read:
        moved to ``ttl_ms`` from now and marked running, guarded by the value
        read; the run's row as the take left it (``Taken``) if this lane
        took it, else None. Where ``takes_run_leases``, the run lease
        ``key`` is acquired for ``holder`` for ``ttl_ms`` in the same round
        trip. SQLite's guarded UPDATE: SQLite serialises writers, so there is
        no other lane's lock to skip.
        """
        cursor.execute(sql.statement("run_take", connection), params)
        row = cursor.fetchone()
        return None if row is None else (cursor.description, row, None)

    def take_runs(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: list[dict[str, Any]]
    ) -> list[Taken | None]:
        """``take_run`` of each of ``params``, in the caller's transaction, in the fewest round trips."""
        return [self.take_run(connection, cursor, each) for each in params]

    def end_run(
        self, connection: BaseDatabaseWrapper, cursor: Any, name: str, params: dict[str, Any]
    ) -> tuple[Any, tuple[Any, ...]] | None:
        """
        A top-level run's outcome ``name`` (``sql.runs._RUN_FINISH``): the end
        it stored, as (description, row), or None if it matched nothing.
        """
        cursor.execute(sql.statement(name, connection), params)
        row = cursor.fetchone()
        return None if row is None else (cursor.description, row)

    def end_pass(
        self, connection: BaseDatabaseWrapper, cursor: Any, name: str, params: dict[str, Any]
    ) -> PassEnd:
        """
        A pass's end in one statement or round trip (``sql.ends``): the last
        step's outcome (``done_*``), the run's outcome ``name`` guarded by it,
        and the run lease's release, in the caller's transaction. Only where
        ``ends_passes``: SQLite sends them apart (``HeldFinish`` does).
        """
        raise NotImplementedError

    def end_passes(
        self, connection: BaseDatabaseWrapper, cursor: Any, ends: list[tuple[str, dict[str, Any]]]
    ) -> list[PassEnd]:
        """
        Several passes' ends (``end_pass``'s ``name`` and ``params`` each), in
        the caller's transaction, in the fewest round trips the vendor allows.
        """
        return [self.end_pass(connection, cursor, name, params) for name, params in ends]

    # -- steps ------------------------------------------------------------------------

    def history(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        step_id: Any,
        attempt: int,
        holder: str,
        params: dict[str, Any] | None = None,
    ) -> None:
        """
        The history row of attempt ``attempt`` of a step just claimed or
        started; its ``running_at`` is the now of the claim's ``params``
        (the step's ``updated_at``), when given.
        """
        now = (
            now_params(connection)
            if params is None or "now_dt" not in params
            else {"now_dt": params["now_dt"]}
        )
        cursor.execute(
            sql.statement("step_claim_history", connection),
            {"step_id": step_id, "attempt": attempt, "holder": holder, **now},
        )

    def start_step(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> bool:
        """Insert a step already claimed, with its attempt row; False if refused (``sql`` ``step_start``)."""
        with nullcontext() if within else one_transaction(connection, cursor):
            cursor.execute(sql.statement("step_start", connection), params)
            if cursor.fetchone() is None:
                return False
            self.history(connection, cursor, params["step_id"], 1, params["holder"])
        return True

    def handoff(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], done: dict[str, Any]
    ) -> tuple[bool, bool]:
        """
        The held outcome ``done`` and the start ``params`` in one transaction:
        (the outcome matched its attempt, the step was started). A refused
        start commits the outcome on its own; an outcome that did not match
        starts nothing.
        """
        with one_transaction(connection, cursor):
            finished = self.write_finish(connection, cursor, done, within=True)
            started = finished and self.start_step(connection, cursor, params, within=True)
        return finished, started

    def claim_attempt(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> int | None:
        """
        The guarded claim of a step's next attempt with its history row: the
        attempt now run, or None. ``within``: in the caller's transaction.
        """
        with nullcontext() if within else one_transaction(connection, cursor):
            cursor.execute(sql.statement("step_claim_attempt", connection), params)
            row = cursor.fetchone()
            if row is None:
                return None
            attempt = int(row[1])
            self.history(connection, cursor, row[0], attempt, params["holder"])
        return attempt

    def claim_step(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        params: dict[str, Any],
        from_row: StepFromRow,
        *,
        within: bool = False,
    ) -> WorkflowStep | None:
        """
        ``claim()``'s guarded UPDATE and its history row: the claimed step, or
        None. ``within``: in the caller's transaction.
        """
        with nullcontext() if within else one_transaction(connection, cursor):
            cursor.execute(sql.statement("step_claim", connection), params)
            row = cursor.fetchone()
            if row is None:
                return None
            step = from_row(cursor.description, row)
            step_id = step._meta.pk.get_db_prep_value(step.pk, connection)
            self.history(connection, cursor, step_id, step.attempt, params["holder"], params)
        return step

    def claim_steps(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        params: list[dict[str, Any]],
        from_row: StepFromRow,
    ) -> list[WorkflowStep | None]:
        """``claim_step`` of each of ``params``, in the caller's transaction, in the fewest round trips."""
        return [self.claim_step(connection, cursor, each, from_row, within=True) for each in params]

    def write_finish(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool
    ) -> bool:
        """The fenced UPDATE of an attempt's outcome and its history row; False if superseded."""
        with nullcontext() if within else one_transaction(connection, cursor):
            cursor.execute(sql.statement("step_finish", connection), params)
            if cursor.rowcount != 1:
                # Nothing was written: the transaction commits empty.
                return False
            cursor.execute(sql.statement("step_finish_history", connection), params)
        return True


def done_params(done: dict[str, Any]) -> dict[str, Any]:
    """A held outcome's parameters renamed ``done_*``, beside a start's in one statement."""
    return {f"done_{name}": value for name, value in done.items() if name != "now_dt"}
