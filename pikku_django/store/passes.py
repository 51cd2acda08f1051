"""
The commit that closes a worker's pass, besides its steps (the one that
opens it is ``takes.take_run``'s).

- ``finish_pass``: the run's outcome, the last step's success (when the
  workflow ended right after it) and the run lease's release, in one
  transaction.
- ``HeldFinish``: that outcome held by its lane, to commit with the lane's
  next take (``write_within``, in the take's transaction) or on its own
  (``write_held``).

Each write keeps its own guard inside the transaction: the take its
``wake_at``, the lease its acquire rules, the claim its attempt, budget and
lease rules (the same statement a pass sends), the step's outcome its attempt, the
run's outcome the run lease, the release its holder and token. Joining them
only saves commits; a rolled-back transaction leaves what was there, and
one the server rolled back for a conflict with another lane is sent again
(``conflicts.retried``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef

from pikku_django.clock import DbNow
from pikku_django.errors import StepSupersededError
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.managers.base import WOKEN, ensure_autocommit
from pikku_django.managers.fence import RunFence
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sql.batches import one_transaction
from pikku_django.sql.conflicts import in_transaction, retried
from pikku_django.sql.cursors import hot_cursor
from pikku_django.sql.drivers import driver
from pikku_django.sql.drivers.base import PassEnd, done_params
from pikku_django.sql.runs import RUN_OUTCOMES
from pikku_django.store import rollup
from pikku_django.store.lifecycle import UNKNOWN, finish_run, outcome_params, stamp_end
from pikku_django.wakeups import work_due

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pikku_django.leases import HeldLease


@contextmanager
def _transaction(alias: str, *, nests: bool = False) -> Iterator[None]:
    """
    One transaction on ``alias``, in the cheapest form its vendor allows
    (``one_transaction``); ``nests``: a body that opens ``atomic()`` blocks
    of its own needs Django's, so that they become savepoints of it.
    """
    connection = connections[alias]
    ensure_autocommit(connection)
    if nests:
        with transaction.atomic(using=alias):
            yield
        return
    with hot_cursor(connection) as cursor, one_transaction(connection, cursor):
        yield


def write_held(alias: str, finishes: Sequence[HeldFinish]) -> None:
    """The outcomes a lane holds (``HeldFinish``), in one commit of their own."""

    def write() -> list[tuple[bool, bool | None]]:
        with _transaction(alias):
            written = write_within(alias, finishes)
            add_ended_within(alias, finishes, written)
            return written

    written = retried(connections[alias], write)
    for held, answer in zip(finishes, written, strict=True):
        held.committed(*answer)


def write_within(alias: str, finishes: Sequence[HeldFinish]) -> list[tuple[bool, bool | None]]:
    """
    Held outcomes (``HeldFinish.write_within``) in the caller's transaction:
    those that are a pass's end, all in the fewest round trips the vendor
    allows (``Driver.end_passes``), then the others one by one. Each keeps
    its own guards. Their answers, in the order of ``finishes``; the caller
    adds the runs they ended to the per-minute rollup (``add_ended_within``).
    """
    connection = connections[alias]
    written: list[tuple[bool, bool | None] | None] = [None] * len(finishes)
    ends = [(index, held.end()) for index, held in enumerate(finishes)]
    folded = [(index, end) for index, end in ends if end is not None]
    if folded:
        with hot_cursor(connection) as cursor:
            answers = driver(connection).end_passes(connection, cursor, [end for _, end in folded])
        for (index, _), answer in zip(folded, answers, strict=True):
            written[index] = finishes[index].ended(answer)
    return [
        held.write_within() if answer is None else answer
        for held, answer in zip(finishes, written, strict=True)
    ]


def add_ended_within(
    alias: str, finishes: Sequence[HeldFinish], written: Sequence[tuple[bool, bool | None]]
) -> None:
    """
    The runs that held outcomes ended (``written``: ``write_within``'s
    answers), added to the per-minute rollup in one statement
    (``rollup.add_within``), last in the caller's transaction: the
    rollup's row is locked from there to the commit only.
    """
    ended = [
        rollup.ended(held.run, held.status) for held, (done, _) in zip(finishes, written, strict=True) if done
    ]
    rollup.add_within(alias, ended)


def finish_pass(
    alias: str,
    run_id: Any,
    status: str,
    *,
    held: HeldLease | None,
    fence: RunFence | None,
    outcome: PreparedFinish | None = None,
    parent_id: Any = UNKNOWN,
    into: WorkflowRun | None = None,
    **fields: Any,
) -> bool:
    """
    Record the run's outcome (``lifecycle.finish_run``, fenced to the run
    lease; ``into`` as there) in one commit with the last step's success ``outcome`` (fenced to
    its attempt) and the release of the run lease ``held``. A superseded
    attempt raises ``StepSupersededError`` and the transaction writes
    nothing (the run's output came from a result that is not the step's).
    True if the outcome was recorded (and added to the per-minute rollup,
    ``rollup.add_within``, in the same commit). The lease stops being renewed first,
    so no renewal races the release; ``held.released`` tells the lease's
    holder what the release answered.
    """
    if held is not None:
        held.stop_renewing()
    # A child's finish locks and settles its parent in atomic() blocks of its own.

    def write() -> tuple[bool, bool | None]:
        with _transaction(alias, nests=parent_id is not None):
            done = _outcome_within(alias, run_id, status, outcome, parent_id, fence, fields, into)
            if done:
                rollup.add_within(alias, [rollup.ended(into, status)])
            return done, _release_within(alias, held)

    done, released = retried(connections[alias], write)
    if held is not None and released is not None:
        held.released(released)
    return done


def put_back_within(alias: str, step_id: Any, attempt: int) -> bool:
    """
    In the caller's transaction: the step ``step_id``, still running its
    attempt ``attempt``, back to ``scheduled`` with that attempt kept (and
    its attempt row too), so that the next claim takes the same attempt and
    no budget is spent. False if the attempt is not running any more.
    """
    claimed = {"status": "running", "attempt": attempt}
    if (
        not WorkflowStep.objects.using(alias)
        .filter(pk=step_id, **claimed)
        .update(status="scheduled", lease_expires_at=None, updated_at=DbNow())
    ):
        return False
    WorkflowStepAttempt.objects.using(alias).filter(step_id=step_id, **claimed).update(
        status="scheduled", holder="", running_at=None
    )
    return True


def give_back_pass(alias: str, run_id: Any, fence: RunFence, held: HeldLease | None = None) -> int:
    """
    A pass cut short by a conflict that was sent again every time it was
    rolled back: no worker was lost, so none is counted. In one commit,
    fenced to the pass's run lease (``fence``): each step it still runs (its
    attempt running under a lease, written as this holder's) goes back to
    ``scheduled`` with its attempt kept (as ``takes.hand_back`` does, so the
    next claim takes the same attempt and no budget is spent), the run is
    due at once, and the run lease ``held`` is released (``finish_pass``).
    Returns how many steps it gave back.
    """
    if held is not None:
        held.stop_renewing()
    runs = WorkflowRun.objects.using(alias).filter(pk=run_id, status="running").filter(fence.held(alias))
    steps = WorkflowStep.objects.using(alias)
    attempts = WorkflowStepAttempt.objects.using(alias)
    mine = attempts.filter(
        step_id=OuterRef("pk"), attempt=OuterRef("attempt"), status="running", holder=fence.holder
    )
    running = steps.filter(run_id=run_id, status="running", lease_expires_at__isnull=False).filter(
        Exists(mine)
    )

    def write() -> tuple[int, bool | None]:
        given = 0
        if runs.update(wake_at=WOKEN, updated_at=DbNow()):
            work_due(alias)
            for step_id, attempt in running.values_list("pk", "attempt"):
                given += put_back_within(alias, step_id, attempt)
        return given, _release_within(alias, held)

    given, released = in_transaction(alias, write)
    if held is not None and released is not None:
        held.released(released)
    return given


def _outcome_within(
    alias: str,
    run_id: Any,
    status: str,
    outcome: PreparedFinish | None,
    parent_id: Any,
    fence: RunFence | None,
    fields: dict[str, Any],
    into: WorkflowRun | None = None,
) -> bool:
    """The last step's outcome (fenced to its attempt), then the run's (to the run lease)."""

    if outcome is not None:
        WorkflowStep.objects.db_manager(alias).write_finish(outcome, within=True)
    return finish_run(alias, run_id, status, parent_id=parent_id, fence=fence, into=into, **fields)


def _release_within(alias: str, held: HeldLease | None) -> bool | None:
    """The run lease's release in the caller's transaction: what it answered (None: no lease)."""

    return None if held is None else Lease.objects.db_manager(alias).release_within(held.lease)


def _superseded(run_id: Any) -> None:
    # A newer attempt owns the last step: this pass is stale (nothing was written).
    logger.warning("Run %s: its last step's attempt was superseded; its pass ends.", run_id)


@dataclass
class HeldFinish:
    """
    A pass's outcome (what ``finish_pass`` writes, for a run with no parent)
    held by its lane for the lane's next take, so that the two commit
    together. Until then the outcome is not reported anywhere: ``then``
    runs once it has committed, given whether it was recorded. A lane with
    no take to make writes it alone (``alone``: ``finish_pass`` and the
    pass's own handling of its errors). A crash in between loses only this
    outcome: its run lease and step lease lapse, and the step runs again as
    a new attempt under the same fence.
    """

    alias: str
    run_id: Any
    status: str
    held: HeldLease | None
    fence: RunFence | None
    outcome: PreparedFinish | None
    fields: dict[str, Any]
    then: Callable[[bool], None]
    alone: Callable[[], None]
    #: The pass's instance of the run (``finish_run``'s ``into``).
    run: WorkflowRun | None = None

    def write_within(self) -> tuple[bool, bool | None]:
        """
        The outcome's writes, in the caller's transaction: (recorded,
        what the release answered). A superseded last step writes nothing
        and records nothing; the run lease is released all the same.
        """
        end = self.end()
        if end is not None:
            connection = connections[self.alias]
            with hot_cursor(connection) as cursor:
                return self.ended(driver(connection).end_pass(connection, cursor, *end))
        try:
            done = _outcome_within(
                self.alias, self.run_id, self.status, self.outcome, None, self.fence, self.fields, self.run
            )
        except StepSupersededError:
            _superseded(self.run_id)
            done = False
        return done, _release_within(self.alias, self.held)

    def end(self) -> tuple[str, dict[str, Any]] | None:
        """
        ``write_within`` as one pass's end (``Driver.end_pass``'s statement
        name and parameters) where the vendor folds a pass's end into one
        statement or round trip (``sql.ends``); None where it does not, or for
        an outcome that is not the last step's success or failure with the
        run's completion or failure.
        """

        name = RUN_OUTCOMES.get(tuple(sorted(self.fields)))
        connection = connections[self.alias]
        if self.outcome is None or self.held is None or name is None or not driver(connection).ends_passes:
            return None
        lease = self.held.lease
        params = {
            **outcome_params(connection, self.run_id, self.status, self.fence, self.fields),
            **done_params(
                WorkflowStep.objects.db_manager(self.alias).finish_params(self.outcome, connection)
            ),
            "key": lease.key,
            "holder": lease.holder,
            "token": lease.token,
        }
        return f"pass_end_{name}", params

    def ended(self, answer: PassEnd) -> tuple[bool, bool | None]:
        """``write_within``'s answer, from what its ``end`` answered."""
        finished, ended, released = answer
        if not finished:
            _superseded(self.run_id)
            return False, released
        if isinstance(ended, tuple):
            stamp_end(self.run, self.alias, *ended)
        return bool(ended), released

    def committed(self, done: bool, released: bool | None) -> None:
        """The transaction holding the outcome has committed."""
        if released is False:
            logger.warning("Run %s: its run lease had lapsed or passed on by its outcome.", self.run_id)
        self.then(done)
