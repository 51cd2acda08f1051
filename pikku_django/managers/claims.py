"""A step's claim: the guarded UPDATE that takes a step's next attempt under a fresh lease."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.errors import InvalidArgumentError, StepFunctionMismatchError
from pikku_django.managers.base import ensure_autocommit
from pikku_django.sql.conflicts import retried
from pikku_django.sql.cursors import hot_cursor, model_from_row, now_params
from pikku_django.sql.drivers import driver

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from pikku_django.models import WorkflowStep


class StepClaimsMixin:
    """``WorkflowStep.objects``' claims (mixed into ``WorkflowStepManager``)."""

    model: type[WorkflowStep]

    if TYPE_CHECKING:

        def _write_db(self) -> str: ...

        def fail_lost(self, step: WorkflowStep) -> bool: ...

    def claim(
        self,
        run_id: Any,
        step_name: str,
        rpc_name: str,
        lease_ms: int,
        *,
        holder: str | None = None,
        within: bool = False,
    ) -> WorkflowStep | None:
        """
        Take the step to run it under a fresh lease of ``lease_ms``; None when
        it is not this caller's to run (done, held, parked, spent). A step
        whose worker vanished on its last attempt is failed here, and its run
        woken. A different ``rpc_name`` raises ``StepFunctionMismatchError``.
        ``holder`` (the worker's name) is written on the attempt's history row
        by the claim itself. ``within=True``: statements of the caller's
        transaction (a worker's take), and a refused claim is not settled
        here (see ``claim_attempt``).
        """
        alias = self._write_db()
        connection = connections[alias]
        if not within:
            ensure_autocommit(connection)
        params = self._claim_params(connection, run_id, step_name, rpc_name, lease_ms, holder)

        def write() -> WorkflowStep | None:
            with hot_cursor(connection) as cursor:
                return driver(connection).claim_step(
                    connection,
                    cursor,
                    params,
                    lambda description, row: model_from_row(self.model, alias, description, row),
                    within=within,
                )

        step = retried(connection, write, within=within)
        if step is None and not within:
            self._settle_unclaimed(run_id, step_name, rpc_name)
        return step

    def claim_many(
        self, claims: Sequence[tuple[Any, str, str, int]], *, holder: str, provisional: bool = False
    ) -> list[WorkflowStep | None]:
        """
        ``claim(run_id, step_name, rpc_name, lease_ms, holder=holder,
        within=True)`` of each of ``claims``, in the caller's transaction
        and in the fewest round trips its vendor allows (one on
        MySQL/MariaDB): a worker's take of several runs. Each claim keeps
        its own guards; a refused one is None, and not settled here. The
        claims are a take's: they refuse a step whose provisional attempt
        was lost (the pass that runs it claims it). ``provisional``: the
        take took runs ahead, so a worker lost with these attempts may never
        have started them, and spends no budget of theirs.
        """
        alias = self._write_db()
        connection = connections[alias]
        params = [
            self._claim_params(connection, *claim, holder, by_take=True, provisional=provisional)
            for claim in claims
        ]
        if not params:
            return []

        def from_row(description: Any, row: tuple[Any, ...]) -> WorkflowStep:
            return model_from_row(self.model, alias, description, row)

        with hot_cursor(connection) as cursor:
            return driver(connection).claim_steps(connection, cursor, params, from_row)

    def _claim_params(
        self,
        connection: BaseDatabaseWrapper,
        run_id: Any,
        step_name: str,
        rpc_name: str,
        lease_ms: int,
        holder: str | None,
        *,
        by_take: bool = False,
        provisional: bool = False,
    ) -> dict[str, Any]:
        """A claim's parameters, checked (``claim``); ``by_take``: a worker's take's (``claim_many``)."""
        return {
            "by_take": by_take,
            "provisional": provisional,
            "step_name": validate.name("step_name", step_name),
            "rpc_name": validate.name("rpc_name", rpc_name),
            "lease_ms": validate.positive_ms("lease_ms", lease_ms),
            "holder": "" if holder is None else validate.name("holder", holder),
            "run_id": self.model._meta.get_field("run").get_db_prep_value(run_id, connection),
            **now_params(connection),
        }

    def _settle_unclaimed(self, run_id: Any, step_name: str, rpc_name: str) -> None:  # noqa: C901
        """
        Why did the claim match nothing? A mismatched function raises; a step
        whose worker vanished on its last attempt is failed (fencing that
        worker out) and its run woken; anything else is simply not ours.
        """
        alias = self._write_db()
        step = (
            self.model.objects.using(alias)
            .filter(run_id=run_id, step_name=step_name)
            .annotate(db_now_ms=DbNowMs())
            .first()
        )
        if step is None:
            raise InvalidArgumentError(
                f"step_name {step_name!r} is not a step of run {run_id}; insert_step() it first."
            )
        if step.rpc_name != rpc_name:
            raise StepFunctionMismatchError(run_id, step_name, step.rpc_name, rpc_name)
        lapsed = (
            step.status == "running"
            and step.lease_expires_at is not None
            and step.lease_expires_at <= step.db_now_ms
        )
        if lapsed and step.is_exhausted:
            self.fail_lost(step)
        return None
