"""
The runtime's step path: each write is one commit that writes the step and
its attempt's history row together, and nothing is read back that the
statement could return. In a pass a step costs one commit: its start carries
the success of the step before it.

- ``start_step``: a step run for the first time is inserted already claimed
  (running, attempt 1, under its lease, with its attempt row), with the
  held outcome of the step before it when there is one.
- ``claim_attempt``: the guarded claim of ``claim()``, answering only the
  attempt number now run.
- ``finish_attempt``: the attempt's outcome, fenced to it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import models as pikku_models
from pikku_django import sql, validate
from pikku_django.conf import conf
from pikku_django.errors import InvalidArgumentError, StepSupersededError
from pikku_django.managers.base import ensure_autocommit, serialize_error
from pikku_django.managers.fence import UNFENCED, RunFence
from pikku_django.sql.conflicts import retried
from pikku_django.sql.cursors import hot_cursor, now_params
from pikku_django.sql.drivers import driver

if TYPE_CHECKING:
    from pikku_django.models import WorkflowStep


def json_text(argument: str, value: Any) -> str | None:
    """``value`` as the JSON text stored for it (None is SQL NULL): validated and encoded at once."""
    if value is None:
        return None
    return validate.json_text(argument, value)


def shown_text(value: Any) -> str | None:
    """
    A step's arguments as stored for the admin to show: their JSON text, or
    NULL when they cannot be stored (too large, a NUL): they are only shown,
    so a step is never refused for them.
    """
    try:
        return json_text("data", value)
    except InvalidArgumentError:
        return None


def _holder(holder: str | None) -> str:
    """The worker's name as an attempt row stores it ("" when none is given)."""
    return "" if holder is None else validate.name("holder", holder)


class StepAttemptsMixin:
    """The fast path of ``WorkflowStepManager`` (see the module docstring)."""

    model: type[WorkflowStep]
    _db: str | None

    def _write_connection(self) -> BaseDatabaseWrapper:
        return connections[self._db if self._db else router.db_for_write(self.model)]

    def run_state(self, run_id: Any) -> tuple[str, int | None, int] | None:
        """The run's status and ``deadline_at``, and the DB clock's now; None if there is no such run."""

        connection = self._write_connection()
        params = {"run_id": pikku_models.WorkflowRun._meta.pk.get_db_prep_value(run_id, connection)}
        with hot_cursor(connection) as cursor:
            cursor.execute(sql.statement("run_state", connection), params)
            row = cursor.fetchone()
        if row is None:
            return None
        return str(row[0]), None if row[1] is None else int(row[1]), int(row[2])

    def start_step(
        self,
        run_id: Any,
        step_name: str,
        rpc_name: str,
        lease_ms: int,
        data: Any = None,
        retries: int | None = None,
        retry_delay: int | None = None,
        *,
        worker_losses: int | None = None,
        holder: str | None = None,
        fence: RunFence | None = None,
        outcome: PreparedFinish | None = None,
    ) -> WorkflowStep | None:
        """
        Insert a new step already claimed: running as attempt 1 under a lease
        of ``lease_ms``, with its attempt row (naming ``holder``, the worker),
        in one commit, while the run is active and not past its deadline (and,
        given the pass's ``fence``, while its run lease holds). None
        when the run has a step of this name already (claim it instead), or
        is cancelled, ended or past its deadline. The returned step is built
        in memory: its timestamps and lease expiry are not read.

        ``outcome``: the held outcome of the step before (a pass's), written
        in the same commit, fenced to its attempt; the step is started only
        if it matched. A superseded attempt raises ``StepSupersededError``
        having written nothing; a start refused (None) leaves the outcome
        written on its own.
        """
        params: dict[str, Any] = {
            "step_name": validate.name("step_name", step_name),
            "rpc_name": validate.name("rpc_name", rpc_name),
            "lease_ms": validate.positive_ms("lease_ms", lease_ms),
            "data": shown_text(data),
            "retries": conf.STEP_RETRIES if retries is None else validate.retries("retries", retries),
            "retry_delay": None if retry_delay is None else validate.retry_delay("retry_delay", retry_delay),
            # A worker-loss budget apart from retries (``max_attempts``; see ``WorkflowStep.is_exhausted``).
            "worker_losses": None
            if worker_losses is None
            else validate.retries("worker_losses", worker_losses),
            "holder": _holder(holder),
            **(UNFENCED if fence is None else fence.params()),
        }
        connection = self._write_connection()
        ensure_autocommit(connection)
        step_id = uuid.uuid4()
        params["step_id"] = self.model._meta.pk.get_db_prep_value(step_id, connection)
        params["run_id"] = self.model._meta.get_field("run").get_db_prep_value(run_id, connection)
        params.update(now_params(connection))

        def write() -> bool:
            with hot_cursor(connection) as cursor:
                if outcome is None:
                    return driver(connection).start_step(connection, cursor, params)
                return self._handoff(connection, cursor, params, outcome)

        if not retried(connection, write):
            return None
        return self._started_step(step_id, run_id, step_name, rpc_name, data, params, connection.alias)

    def _started_step(
        self,
        step_id: uuid.UUID,
        run_id: Any,
        step_name: str,
        rpc_name: str,
        data: Any,
        params: dict[str, Any],
        alias: str,
    ) -> WorkflowStep:
        """
        The step ``start_step`` inserted (``params``: its statement's), built in
        memory as stored on ``alias``: its timestamps and lease expiry are not read.
        """
        step = self.model(
            id=step_id,
            run_id=run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            data=None if params["data"] is None else data,
            status="running",
            retries=params["retries"],
            retry_delay=params["retry_delay"],
            worker_losses=params["worker_losses"],
            attempt=1,
        )
        step._state.adding = False
        step._state.db = alias
        return step

    def _handoff(
        self, connection: BaseDatabaseWrapper, cursor: Any, params: dict[str, Any], outcome: PreparedFinish
    ) -> bool:
        """
        The held ``outcome`` and the start ``params`` in one transaction; True
        if the step was started. A superseded outcome raises
        ``StepSupersededError``, and then nothing is written.
        """
        done = self.finish_params(outcome, connection)
        finished, started = driver(connection).handoff(connection, cursor, params, done)
        if not finished:
            raise StepSupersededError(outcome.step_id, outcome.attempt)
        return bool(started)

    def claim_attempt(
        self,
        run_id: Any,
        step_name: str,
        rpc_name: str,
        lease_ms: int,
        *,
        holder: str | None = None,
        within: bool = False,
        by_take: bool = False,
    ) -> int | None:
        """
        ``claim()``, answering only the attempt number now run (or None, after
        the same settling: a mismatched function raises, a step whose worker
        vanished on its last attempt is failed and its run woken). ``holder``
        (the worker's name) is written on the attempt's history row.
        ``within=True``: statements of the caller's transaction (a worker's
        take), and a refused claim is not settled here: the pass claims the
        step again as it would have, and settles then. ``by_take``: a
        worker's take's claim (``WorkflowStep.provisional``; see ``claim_many``).
        """
        params: dict[str, Any] = {
            "by_take": by_take,
            "provisional": False,
            "step_name": validate.name("step_name", step_name),
            "rpc_name": validate.name("rpc_name", rpc_name),
            "lease_ms": validate.positive_ms("lease_ms", lease_ms),
            "holder": _holder(holder),
        }
        connection = self._write_connection()
        if not within:
            ensure_autocommit(connection)
        params["run_id"] = self.model._meta.get_field("run").get_db_prep_value(run_id, connection)
        params.update(now_params(connection))

        def write() -> int | None:
            with hot_cursor(connection) as cursor:
                return driver(connection).claim_attempt(connection, cursor, params, within=within)

        attempt = retried(connection, write, within=within)
        if attempt is None and not within:
            self._settle_unclaimed(run_id, step_name, rpc_name)  # type: ignore[attr-defined]
        return attempt

    def finish_attempt(
        self, step_id: Any, attempt: int, *, result: Any = None, error: BaseException | None = None
    ) -> Any:
        """
        Record attempt ``attempt``'s outcome: failed with ``error`` when one is
        given, else succeeded with ``result``. One commit, fenced to the
        attempt: a superseded attempt raises ``StepSupersededError`` and
        writes nothing. Returns the result as a replay will return it (its
        JSON round trip).
        """
        finish = self.prepare_finish(step_id, attempt, result=result, error=error)
        self.write_finish(finish)
        return finish.stored

    def prepare_finish(
        self,
        step_id: Any,
        attempt: int,
        *,
        result: Any = None,
        error: BaseException | None = None,
        next_delay: int | None = None,
        final: bool = False,
    ) -> PreparedFinish:
        """
        An attempt's outcome, validated and encoded, ready for ``write_finish``
        (a result that cannot be stored raises ``InvalidArgumentError`` here,
        before any SQL): a pass may keep it until its next write. A failure
        may carry its policy's verdict: ``final`` (no other attempt: the
        step's budget is spent) or ``next_delay`` (ms before the next
        attempt, on the database clock: the step's new ``retry_delay``).
        """
        validate.whole("attempt", attempt, minimum=1, maximum=validate.MAX_INTEGER)
        if error is not None:
            if not isinstance(error, BaseException):
                raise InvalidArgumentError(f"error must be an exception, not {type(error).__name__}.")
            delay = None if next_delay is None else validate.retry_delay("next_delay", next_delay)
            return PreparedFinish(
                step_id, attempt, "failed", None, json.dumps(serialize_error(error)), delay, bool(final)
            )
        return PreparedFinish(step_id, attempt, "succeeded", json_text("result", result), None)

    def write_finish(self, finish: PreparedFinish, *, within: bool = False) -> None:
        """
        Write a prepared outcome, fenced to its attempt: one commit of its own,
        or with ``within=True`` statements of the caller's transaction (the
        pass's outcome, committed with it). A superseded attempt raises
        ``StepSupersededError`` having written nothing.
        """
        connection = self._write_connection()
        params = self.finish_params(finish, connection)

        def write() -> bool:
            with hot_cursor(connection) as cursor:
                return driver(connection).write_finish(connection, cursor, params, within=within)

        if not retried(connection, write, within=within):
            raise StepSupersededError(finish.step_id, finish.attempt)

    def finish_params(self, finish: PreparedFinish, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        """The parameters of an outcome's statements (``sql.*_STEP_FINISH``)."""
        return {
            "step_id": self.model._meta.pk.get_db_prep_value(finish.step_id, connection),
            "attempt": finish.attempt,
            "status": finish.status,
            "result": finish.result_text,
            "error": finish.error_text,
            "next_delay": finish.next_delay,
            "final": finish.final,
            **now_params(connection),
        }


@dataclass(frozen=True)
class PreparedFinish:
    """An attempt's outcome as ``write_finish`` writes it: status and JSON texts."""

    step_id: Any
    attempt: int
    status: str
    result_text: str | None
    error_text: str | None
    #: A failure's delay before the next attempt (ms), when a backoff gave one.
    next_delay: int | None = None
    #: A failure that allows no other attempt: its step's budget is spent.
    final: bool = False

    @property
    def stored(self) -> Any:
        """The result as a replay returns it (its JSON round trip)."""
        return None if self.result_text is None else json.loads(self.result_text)
