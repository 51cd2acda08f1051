"""
The two commits that open and close a worker's pass, besides its steps.

- ``take_run``: the take of a due run and its run lease, in one transaction:
  the guarded move of ``wake_at`` (so no other lane takes the run), the
  lease ``workflow-run:<id>`` (so no other pass drives it) and, for a run
  whose first step is known from the run alone (a Django task's), that
  step's claim with its attempt row. A task's pass is then two commits: this
  one, and ``finish_pass`` (issue 14).
- ``finish_pass``: the run's outcome, the last step's success (when the
  workflow ended right after it) and the run lease's release, in one
  transaction.

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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from pikku_django.clock import DbNowMs
from pikku_django.errors import StepSupersededError
from pikku_django.managers.attempts import PreparedFinish
from pikku_django.managers.base import ensure_autocommit, hot_cursor, model_from_row
from pikku_django.managers.batches import one_transaction
from pikku_django.managers.conflicts import retried
from pikku_django.managers.drivers import driver
from pikku_django.managers.drivers.base import PassEnd, done_params
from pikku_django.managers.fence import RunFence
from pikku_django.managers.lifecycle import UNKNOWN, finish_run, outcome_params, stamp_end
from pikku_django.sql.runs import RUN_OUTCOMES

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pikku_django.leases import HeldLease
    from pikku_django.models import Lease, WorkflowRun, WorkflowStep
    from pikku_django.workflows.registry import FirstStep


@dataclass(frozen=True)
class Take:
    """
    What a take got: the run (``taken``), its run lease (None while another
    pass holds it), the run as read inside the take, and the steps it
    claimed (step name to attempt number) for the pass to run.
    """

    taken: bool
    lease: Lease | None = None
    run: WorkflowRun | None = None
    claimed: dict[str, int] = field(default_factory=dict)
    #: The run taken: the one asked for, or one of the alternates.
    run_id: Any = None
    #: Every step of the run, when the take claimed the only one (``FirstStep.only``); else None.
    steps: list[WorkflowStep] | None = None
    #: More runs taken in the same commit, each with its run lease (``take_run``'s ``ahead``).
    ahead: tuple[Take, ...] = ()


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


def take_run(
    alias: str,
    run_id: Any,
    wake_at: int | None,
    holder: str,
    ttl_ms: int,
    retry_ms: int,
    *,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None = None,
    finish: HeldFinish | Sequence[HeldFinish] | None = None,
    alternates: Sequence[tuple[Any, int | None]] = (),
    ahead: int = 0,
) -> Take:
    """
    Take a due run for a pass, in one commit: move its ``wake_at`` to when
    the run lease would lapse, guarded by the value read (another lane that
    read it matches nothing), mark it running (a suspended run taken is one
    whose wait timed out), and acquire its run lease for ``holder``. A run
    whose lease another pass holds is taken all the same, and due again
    ``retry_ms`` later. With the lease, the run is read, and the step
    ``first_step(run)`` names is claimed (``claim_attempt``, the pass's own
    guarded claim) in the same commit; a claim refused claims nothing, and
    the pass then claims the step as it would have.

    On PostgreSQL and MySQL/MariaDB a run another lane is taking is skipped,
    not waited for: the losing lane writes nothing (``drivers``, ``sql.runs``). On SQLite
    the first statement writes, so the transaction takes the write lock at once.

    ``finish``: the outcomes of the lane's last passes, held for this commit
    (``HeldFinish``): written first, each write with its own guard, so a lane
    that goes from run to run pays one commit per run, or less.

    ``alternates``: more due runs, as (id, wake_at), tried in order in the
    same transaction while the ones before were not taken (another lane
    took them, or is taking them): the lanes woken together race for the
    first due run, and the losers take the next in the same commit.

    ``ahead``: once a run is taken, up to this many of the alternates after
    it are taken too (``Take.ahead``), each with its run lease and the
    claim of its only step (a task's; a run with more steps is claimed by
    its pass), so that a lane going through a backlog of short runs pays
    one commit for several. Runs another pass holds are left due, as above.
    """
    from pikku_django.models import WorkflowRun

    connection = connections[alias]
    ensure_autocommit(connection)
    to_db = WorkflowRun._meta.pk.get_db_prep_value
    candidates = [(run_id, wake_at), *alternates]
    finishes = [] if finish is None else [finish] if isinstance(finish, HeldFinish) else list(finish)

    def only_step(run: WorkflowRun) -> FirstStep | None:
        step = None if first_step is None else first_step(run)
        return step if step is not None and step.only else None

    def write() -> tuple[list[tuple[bool, bool | None]], Take]:
        with hot_cursor(connection) as cursor, one_transaction(connection, cursor):
            written = write_within(alias, finishes)
            take = Take(False)
            more: list[Take] = []
            for candidate, read_wake_at in candidates:
                if take.taken and len(more) >= ahead:
                    break
                params = {"run_id": to_db(candidate, connection), "wake_at": read_wake_at, "ttl_ms": ttl_ms}
                if not take.taken:
                    take = _take_within(alias, cursor, candidate, params, holder, retry_ms, first_step)
                    continue
                extra = _take_within(alias, cursor, candidate, params, holder, retry_ms, only_step)
                if not extra.taken:
                    # Another lane is taking these too: leave it the rest.
                    break
                if extra.lease is not None and extra.run is not None:
                    more.append(extra)
            if more:
                take = replace(take, ahead=tuple(more))
        return written, take

    written, take = retried(connection, write)
    for held, answer in zip(finishes, written, strict=True):
        held.committed(*answer)
    return take


def write_held(alias: str, finishes: Sequence[HeldFinish]) -> None:
    """The outcomes a lane holds (``HeldFinish``), in one commit of their own."""

    def write() -> list[tuple[bool, bool | None]]:
        with _transaction(alias):
            return write_within(alias, finishes)

    written = retried(connections[alias], write)
    for held, answer in zip(finishes, written, strict=True):
        held.committed(*answer)


def write_within(alias: str, finishes: Sequence[HeldFinish]) -> list[tuple[bool, bool | None]]:
    """
    Held outcomes (``HeldFinish.write_within``) in the caller's transaction:
    those that are a pass's end, all in the fewest round trips the vendor
    allows (``Driver.end_passes``), then the others one by one. Each keeps
    its own guards. Their answers, in the order of ``finishes``.
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


def _take_within(
    alias: str,
    cursor: Any,
    run_id: Any,
    params: dict[str, Any],
    holder: str,
    retry_ms: int,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None,
) -> Take:
    """``take_run``'s statements, in the transaction it opened."""
    from pikku_django.models import Lease, WorkflowRun, WorkflowStep

    connection = connections[alias]
    vendor = driver(connection)
    key = WorkflowRun(pk=run_id).lease_key
    taken = vendor.take_run(connection, cursor, {**params, "key": key, "holder": holder})
    if taken is None:
        return Take(False, run_id=run_id)
    leases = Lease.objects.db_manager(alias)
    if vendor.takes_run_leases(connection):
        # Acquired in the take's own round trip; the take's when its holder is.
        lease_row = taken[2]
        lease = leases.from_row(lease_row, alias) if lease_row and lease_row[1] == holder else None
    else:
        lease = leases.acquire_within(key, holder, params["ttl_ms"])
    if lease is None:
        # Held elsewhere: look again a little later (as a pass that meets it does).
        runs = WorkflowRun.objects.using(alias)
        runs.filter(pk=run_id, status="running").update(wake_at=DbNowMs() + retry_ms)
        return Take(True, run_id=run_id)
    # As the take left it (the due query reads only ids).
    run = model_from_row(WorkflowRun, alias, *taken[:2])
    claimed: dict[str, int] = {}
    step = None if run is None or first_step is None else first_step(run)
    if step is None:
        return Take(True, lease, run, claimed, run_id)
    steps = WorkflowStep.objects.db_manager(alias)
    if not step.only:
        attempt = steps.claim_attempt(
            run_id, step.name, step.rpc_name, step.lease_ms, holder=holder, within=True
        )
        if attempt is not None:
            claimed[step.name] = attempt
        return Take(True, lease, run, claimed, run_id)
    # The run's only step, read back by its claim: the pass reads no step.
    row = steps.claim(run_id, step.name, step.rpc_name, step.lease_ms, holder=holder, within=True)
    if row is None:
        return Take(True, lease, run, claimed, run_id)
    claimed[step.name] = row.attempt
    return Take(True, lease, run, claimed, run_id, [row])


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
    True if the outcome was recorded. The lease stops being renewed first,
    so no renewal races the release; ``held.released`` tells the lease's
    holder what the release answered.
    """
    if held is not None:
        held.stop_renewing()
    # A child's finish locks and settles its parent in atomic() blocks of its own.

    def write() -> tuple[bool, bool | None]:
        with _transaction(alias, nests=parent_id is not None):
            return (
                _outcome_within(alias, run_id, status, outcome, parent_id, fence, fields, into),
                _release_within(alias, held),
            )

    done, released = retried(connections[alias], write)
    if held is not None and released is not None:
        held.released(released)
    return done


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
    from pikku_django.models import WorkflowStep

    if outcome is not None:
        WorkflowStep.objects.db_manager(alias).write_finish(outcome, within=True)
    return finish_run(alias, run_id, status, parent_id=parent_id, fence=fence, into=into, **fields)


def _release_within(alias: str, held: HeldLease | None) -> bool | None:
    """The run lease's release in the caller's transaction: what it answered (None: no lease)."""
    from pikku_django.models import Lease

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
        from pikku_django.models import WorkflowStep

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
