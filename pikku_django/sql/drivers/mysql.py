"""
MySQL/MariaDB: a step's write and its history row go in one round trip, a
multi-statement batch in one transaction (``managers.batches.batch``,
``sql.MYSQL_MARK``). The answers are the rows matched (``CLIENT.FOUND_ROWS``)
and what a statement left in ``LAST_INSERT_ID``.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql
from pikku_django.sql import schema
from pikku_django.sql.batches import batch, send
from pikku_django.sql.drivers.base import Driver, PassEnd, StepFromRow, Taken, done_params

if TYPE_CHECKING:
    from pikku_django.models import Lease, WorkflowStep


class MySQLDriver(Driver):
    ends_passes = True

    def missing_database(self, connection: BaseDatabaseWrapper, error: BaseException | None) -> bool:
        return error is not None and schema.errno(error) == schema.MYSQL_BAD_DB

    def takes_run_leases(self, connection: BaseDatabaseWrapper) -> bool:
        # MariaDB's upsert returns its row (sql.runs.MARIADB_RUN_TAKE_LEASE).
        return sql.variant(connection) == "mariadb"

    def take_run(self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any]) -> Taken | None:
        # Lock the run unless another lane holds it, move it under the same
        # guard and read it back, in one round trip (sql.MYSQL_RUN_TAKE_LOCK);
        # on MariaDB its run lease too.
        names = self._take_names(connection)
        return _taken(batch(connection, cursor, names, params, within=True))

    def take_runs(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: list[dict[str, Any]]
    ) -> list[Taken | None]:
        # Every take in one round trip, each starting with its own reset of @pikku_take.
        names = self._take_names(connection)
        return [
            _taken(results) for results in _in_one(connection, cursor, [(names, each) for each in params])
        ]

    def _take_names(self, connection: BaseDatabaseWrapper) -> list[str]:
        names = ["run_take_reset", "run_take_lock", "run_take_move", "run_taken"]
        return [*names, "run_take_lease"] if self.takes_run_leases(connection) else names

    def end_pass(
        self, connection: BaseDatabaseWrapper, cursor: Any, name: str, params: dict[str, Any]
    ) -> PassEnd:
        # One round trip (sql.ends); the run's outcome is guarded by the step's LAST_INSERT_ID.
        # The end the run's outcome stored is read right after it (sql.ends.MYSQL_RUN_END_READ).
        return _pass_end(batch(connection, cursor, _pass_end_names(name), params, within=True))

    def end_passes(
        self, connection: BaseDatabaseWrapper, cursor: Any, ends: list[tuple[str, dict[str, Any]]]
    ) -> list[PassEnd]:
        # Every end in one round trip: each starts with the mark, so no end
        # reads another's LAST_INSERT_ID.
        if len(ends) == 1:
            return [self.end_pass(connection, cursor, *ends[0])]
        groups = [(_pass_end_names(name), params) for name, params in ends]
        return [_pass_end(results) for results in _in_one(connection, cursor, groups)]

    def end_run(
        self, connection: BaseDatabaseWrapper, cursor: Any, name: str, params: dict[str, Any]
    ) -> tuple[Any, tuple[Any, ...]] | None:
        # The outcome and the read of the end it stored, in one round trip.
        _, (_, _, rows, description) = batch(connection, cursor, [name, "run_end_read"], params, within=True)
        return (description, rows[0]) if rows else None

    def refreshed(self, cursor: Any, lease: Lease) -> tuple[Any, ...] | None:
        # Rows matched; the expiry rides in LAST_INSERT_ID.
        if cursor.rowcount != 1:
            return None
        return (lease.key, lease.holder, lease.token, cursor.lastrowid)

    def start_step(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> bool:
        # A duplicate (run, step name) stops the batch at the step row.
        try:
            (inserted, *_), _ = batch(
                connection, cursor, ["step_start", "step_start_history"], params, within=within
            )
        except IntegrityError:
            return False
        return bool(inserted == 1)

    def handoff(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], done: dict[str, Any]
    ) -> tuple[bool, bool]:
        # One round trip; the start is guarded by the outcome's match (its LAST_INSERT_ID).
        names = ["mark", "step_handoff_finish", "step_handoff_start", "step_start_history"]
        try:
            _, (matched, *_), (inserted, *_), _, _ = batch(
                connection, cursor, [*names, "step_handoff_finish_history"], {**params, **done_params(done)}
            )
        except IntegrityError:
            # Another pass inserted the step: the whole transaction rolled
            # back, so the outcome is written on its own, as it was held.
            return self.write_finish(connection, cursor, done, within=False), False
        return matched == 1, inserted == 1

    def claim_attempt(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool = False
    ) -> int | None:
        # The claim and its history row in one transaction and one round trip.
        names = ["mark", "step_claim_attempt", "step_claim_attempt_history"]
        _, (matched, claimed, _, _), _ = batch(connection, cursor, names, params, within=within)
        # Rows matched; the attempt rides in LAST_INSERT_ID.
        return int(claimed) if matched == 1 else None

    def claim_step(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        params: dict[str, Any],
        from_row: StepFromRow,
        *,
        within: bool = False,
    ) -> WorkflowStep | None:
        # The claim, its read-back and its history row in one transaction and one round trip.
        return _claimed(batch(connection, cursor, _CLAIM, params, within=within), from_row)

    def claim_steps(
        self,
        connection: BaseDatabaseWrapper,
        cursor: Any,
        params: list[dict[str, Any]],
        from_row: StepFromRow,
    ) -> list[WorkflowStep | None]:
        # Every claim in one round trip, each starting with its own mark.
        groups = [(_CLAIM, each) for each in params]
        return [_claimed(results, from_row) for results in _in_one(connection, cursor, groups)]

    def write_finish(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], *, within: bool
    ) -> bool:
        # The fenced UPDATE and its history row in one round trip (and one
        # transaction, unless the caller's holds them).
        names = ["mark", "step_finish", "step_finish_history"]
        _, (matched, *_), _ = batch(connection, cursor, names, params, within=within)
        return bool(matched == 1)


def _pass_end_names(name: str) -> list[str]:
    """A pass's end (``end_pass``), with the run's outcome ``name``."""
    return ["mark", "step_handoff_finish", name, "run_end_read", "lease_release", "pass_end_finish_history"]


def _pass_end(results: list[Any]) -> PassEnd:
    """What the statements of ``_pass_end_names`` answered."""
    _, (finished, *_), _, (_, _, rows, description), (released, *_), _ = results
    return finished == 1, (description, rows[0]) if rows else False, released == 1


def _taken(results: list[Any]) -> Taken | None:
    """What a take's statements (``_take_names``) answered."""
    (moved, *_), (_, _, rows, description) = results[2:4]
    if moved != 1 or not rows:
        return None
    lease = results[4][2] if len(results) > 4 else None
    return description, rows[0], lease[0] if lease else None


#: A claim, its read-back and its history row.
_CLAIM = ["mark", "step_claim_attempt", "step_claimed", "step_claim_attempt_history"]


def _claimed(results: list[Any], from_row: StepFromRow) -> WorkflowStep | None:
    """What a claim's statements (``_CLAIM``) answered."""
    _, _, (_, _, rows, description), _ = results
    return from_row(description, rows[0]) if rows else None


def _in_one(
    connection: BaseDatabaseWrapper, cursor: Any, groups: list[tuple[list[str], dict[str, Any]]]
) -> list[list[Any]]:
    """
    Several writes, each its statements ``names`` with its ``params``, in one
    round trip of the caller's transaction: each write's parameters are
    renamed apart (``_numbered``). Each write's answers, in order.
    """
    texts: list[str] = []
    params: dict[str, Any] = {}
    for index, (names, each) in enumerate(groups):
        texts.extend(_numbered(sql.statement(name, connection), index) for name in names)
        params.update({f"{key}__{index}": value for key, value in each.items()})
    results = send(connection, cursor, texts, params, within=True)
    answers = []
    for names, _ in groups:
        answers.append(results[: len(names)])
        results = results[len(names) :]
    return answers


_PARAMETER = re.compile(r"%\((\w+)\)s")


@functools.lru_cache(maxsize=1024)
def _numbered(text: str, index: int) -> str:
    """``text`` with each parameter ``%(name)s`` renamed ``%(name__index)s``."""
    return _PARAMETER.sub(lambda found: f"%({found.group(1)}__{index})s", text)
