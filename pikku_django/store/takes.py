"""
The commit that opens a worker's pass: ``take_run``, the take of a due run
and its run lease, in one transaction: the guarded move of ``wake_at`` (so
no other lane takes the run), the lease ``workflow-run:<id>`` (so no other
pass drives it) and, for a run whose first step is known from the run alone
(a Django task's), that step's claim with its attempt row. A task's pass is
then two commits: this one, and ``passes.finish_pass`` (issue 14); a lane
holding outcomes writes them in this one too (``passes.write_within``).

Each write keeps its own guard inside the transaction: the take its
``wake_at``, the lease its acquire rules, the claim its attempt, budget and
lease rules (the same statement a pass sends). Joining them only saves
commits; a rolled-back transaction leaves what was there, and one the
server rolled back for a conflict with another lane is sent again
(``conflicts.retried``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Least

from pikku_django import wakeups
from pikku_django.clock import DbNowMs
from pikku_django.managers.base import ensure_autocommit
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.sql.batches import one_transaction
from pikku_django.sql.conflicts import retried
from pikku_django.sql.cursors import hot_cursor, model_from_row
from pikku_django.sql.drivers import driver
from pikku_django.sql.drivers.base import Taken
from pikku_django.store import rollup
from pikku_django.store.passes import HeldFinish, add_ended_within, put_back_within, write_within

if TYPE_CHECKING:
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

    connection = connections[alias]
    ensure_autocommit(connection)
    candidates = [(run_id, wake_at), *alternates]
    finishes = [] if finish is None else [finish] if isinstance(finish, HeldFinish) else list(finish)

    def write() -> tuple[list[tuple[bool, bool | None]], Take]:
        with hot_cursor(connection) as cursor, one_transaction(connection, cursor):
            written = write_within(alias, finishes)
            take = _take_first(alias, cursor, candidates, holder, ttl_ms, retry_ms, first_step, ahead)
            add_ended_within(alias, finishes, written)
        return written, take

    written, take = retried(connection, write)
    for held, answer in zip(finishes, written, strict=True):
        held.committed(*answer)
    return take


def _take_first(
    alias: str,
    cursor: Any,
    candidates: Sequence[tuple[Any, int | None]],
    holder: str,
    ttl_ms: int,
    retry_ms: int,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None,
    ahead: int,
) -> Take:
    """
    ``take_run``'s takes, in the transaction it opened: each candidate in
    turn until one is taken, then up to ``ahead`` of those after it
    (``_take_ahead_within``).
    """
    take = Take(False)
    for index, (candidate, read_wake_at) in enumerate(candidates):
        params = _take_params(alias, candidate, read_wake_at, holder, ttl_ms)
        take = _take_within(alias, cursor, candidate, params, retry_ms, first_step, provisional=ahead > 0)
        if take.taken:
            rest = candidates[index + 1 : index + 1 + ahead]
            if rest:
                more = _take_ahead_within(alias, cursor, rest, holder, ttl_ms, retry_ms, first_step)
                take = replace(take, ahead=tuple(more))
            break
    return take


def _take_within(
    alias: str,
    cursor: Any,
    run_id: Any,
    params: dict[str, Any],
    retry_ms: int,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None,
    *,
    provisional: bool,
) -> Take:
    """
    ``take_run``'s statements, in the transaction it opened (``params``:
    ``_take_params``). ``provisional``: the take means to take runs ahead
    too, so the run's only step is claimed provisional (its outcome may be
    held while the others run).
    """

    connection = connections[alias]
    holder = params["holder"]
    taken = driver(connection).take_run(connection, cursor, params)
    if taken is None:
        return Take(False, run_id=run_id)
    lease = _run_lease(alias, run_id, params, taken, retry_ms)
    if lease is None:
        return Take(True, run_id=run_id)
    # As the take left it (the due query reads only ids).
    run = model_from_row(WorkflowRun, alias, *taken[:2])
    rollup.note_start(run, params["wake_at"], params["ttl_ms"])
    claimed: dict[str, int] = {}
    step = None if run is None or first_step is None else first_step(run)
    if step is None:
        return Take(True, lease, run, claimed, run_id)
    steps = WorkflowStep.objects.db_manager(alias)
    if not step.only:
        attempt = steps.claim_attempt(
            run_id, step.name, step.rpc_name, step.lease_ms, holder=holder, within=True, by_take=True
        )
        if attempt is not None:
            claimed[step.name] = attempt
        return Take(True, lease, run, claimed, run_id)
    # The run's only step, read back by its claim: the pass reads no step.
    claim = (run_id, step.name, step.rpc_name, step.lease_ms)
    (row,) = steps.claim_many([claim], holder=holder, provisional=provisional)
    return _claimed(lease, run, step, row)


def _take_ahead_within(
    alias: str,
    cursor: Any,
    candidates: Sequence[tuple[Any, int | None]],
    holder: str,
    ttl_ms: int,
    retry_ms: int,
    first_step: Callable[[WorkflowRun], FirstStep | None] | None,
) -> list[Take]:
    """
    The runs ``take_run`` takes ahead, in the transaction it opened: every
    candidate's take (with its run lease) in one go, then every only step's
    claim in one go (``Driver.take_runs``, ``claim_many``: one round trip
    each on MySQL/MariaDB). Each keeps its own guards; a candidate another
    lane or process is taking is passed over, one whose run lease another
    pass holds is left due a little later. The runs taken, with their leases.
    """

    connection = connections[alias]
    params = [
        _take_params(alias, candidate, read_wake_at, holder, ttl_ms) for candidate, read_wake_at in candidates
    ]
    got: list[tuple[Lease, WorkflowRun, FirstStep | None]] = []
    takens = driver(connection).take_runs(connection, cursor, params)
    for (candidate, _), each, taken in zip(candidates, params, takens, strict=True):
        lease = None if taken is None else _run_lease(alias, candidate, each, taken, retry_ms)
        if taken is not None and lease is not None:
            run = model_from_row(WorkflowRun, alias, *taken[:2])
            rollup.note_start(run, each["wake_at"], each["ttl_ms"])
            got.append((lease, run, _only_step(first_step, run)))
    claims = [(run.pk, step.name, step.rpc_name, step.lease_ms) for _, run, step in got if step is not None]
    rows = iter(WorkflowStep.objects.db_manager(alias).claim_many(claims, holder=holder, provisional=True))
    return [
        Take(True, lease, run, {}, run.pk) if step is None else _claimed(lease, run, step, next(rows))
        for lease, run, step in got
    ]


def _only_step(
    first_step: Callable[[WorkflowRun], FirstStep | None] | None, run: WorkflowRun
) -> FirstStep | None:
    """The step ``first_step`` names for ``run`` when it is the run's only one (a task's), else None."""
    step = None if first_step is None else first_step(run)
    return step if step is not None and step.only else None


def _take_params(alias: str, run_id: Any, wake_at: int | None, holder: str, ttl_ms: int) -> dict[str, Any]:
    """A take's parameters (``Driver.take_run``): the run and the ``wake_at`` read, and its run lease's."""

    return {
        "run_id": WorkflowRun._meta.pk.get_db_prep_value(run_id, connections[alias]),
        "wake_at": wake_at,
        "ttl_ms": ttl_ms,
        "key": WorkflowRun(pk=run_id).lease_key,
        "holder": holder,
    }


def _run_lease(alias: str, run_id: Any, params: dict[str, Any], taken: Taken, retry_ms: int) -> Lease | None:
    """
    The run lease of a run just taken (``params``: the take's, with the
    lease's key and holder): from the take's own answer where the driver
    takes it there (``takes_run_leases``), else acquired now. Held by
    another pass, the run is due again ``retry_ms`` later (as a pass that
    meets it does), and None.
    """

    connection = connections[alias]
    leases = Lease.objects.db_manager(alias)
    lease: Lease | None
    if driver(connection).takes_run_leases(connection):
        # Acquired in the take's own round trip; the take's when its holder is.
        row = taken[2]
        lease = leases.from_row(row, alias) if row and row[1] == params["holder"] else None
    else:
        lease = leases.acquire_within(params["key"], params["holder"], params["ttl_ms"])
    if lease is None:
        runs = WorkflowRun.objects.using(alias)
        runs.filter(pk=run_id, status="running").update(wake_at=DbNowMs() + retry_ms)
    return lease


def _claimed(lease: Lease, run: WorkflowRun, step: FirstStep, row: WorkflowStep | None) -> Take:
    """A take of ``run`` whose only ``step`` was claimed (``row``), or refused (None)."""
    if row is None:
        return Take(True, lease, run, {}, run.pk)
    return Take(True, lease, run, {step.name: row.attempt}, run.pk, [row])


def hand_back(alias: str, takes: Sequence[Take]) -> int:
    """
    Give back runs taken ahead whose pass never started (a SIGTERM, a lane
    held up by a long run, a pause past their leases), in one commit: each
    one's run lease lapsed, the run due again at once (``wake_at`` 0, the
    front of its priority, where it was taken from), and the step its take
    claimed put back as ``scheduled`` (its attempt number kept, no loss
    counted, its history row no longer running), so the next take claims
    the same attempt and no budget is spent. Each is guarded by its own run
    lease (this holder and token, live or lapsed): a run another pass has
    taken meanwhile is left alone. Returns how many were given back.
    """
    connection = connections[alias]
    ensure_autocommit(connection)
    mine = [take for take in takes if take.lease is not None and take.run is not None]

    def write() -> int:
        given = 0
        with transaction.atomic(using=alias):
            for take in mine:
                if _give_back_within(alias, take):
                    given += 1
            if given:
                wakeups.work_due(alias)
        return given

    return retried(connection, write) if mine else 0


def _give_back_within(alias: str, take: Take) -> bool:
    """``hand_back`` of one run, in the caller's transaction; False if the run is another pass's now."""
    lease = take.lease
    assert lease is not None
    held = Lease.objects.using(alias).filter(key=lease.key, holder=lease.holder, token=lease.token)
    if not held.update(expires_at=Least(F("expires_at"), DbNowMs())):
        return False
    WorkflowRun.objects.using(alias).filter(pk=take.run_id, status="running").update(wake_at=0)
    for step in take.steps or ():
        put_back_within(alias, step.pk, step.attempt)
    return True
