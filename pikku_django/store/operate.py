"""
Operating a run from outside: revive a failed or cancelled run where it
stopped (``retry_workflow``), or copy it into a new run from a given step
(``fork_workflow``).

The revival's one decision is the guarded UPDATE of the run (still failed or
cancelled, and untouched since it was read), so two retries racing revive it
once. The steps it revives move in the same transaction, after that UPDATE:
on SQLite the transaction's first statement is then the write, which waits
for a busy database instead of failing on a read lock it cannot upgrade.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError
from django.db.models import F, Q

from pikku_django.clock import DbNow, DbNowMs
from pikku_django.errors import (
    DuplicateRunError,
    InvalidArgumentError,
    SignalTimeoutError,
    WorkflowCancelledError,
    WorkflowTimeoutError,
)
from pikku_django.managers.base import PARKED
from pikku_django.managers.signals import SIGNAL_RPC
from pikku_django.managers.steps import write_attempt
from pikku_django.models import (
    Lease,
    WorkflowFanOut,
    WorkflowPatch,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import take_write_lock
from pikku_django.store import fanout
from pikku_django.store.fanout import FAN_OUT_RPCS, release_next
from pikku_django.store.forks import copy_history
from pikku_django.wakeups import work_due

#: Run statuses a retry revives (a timed-out run is failed).
RETRYABLE_RUN_STATUSES = ("failed", "cancelled")

#: The ``rpc_name`` of a sleep and of a child step (``workflows.waits`` names them too).
SLEEP_RPC = "pikku.sleep"
CHILD_RPC = "pikku.workflow"


def _type(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: The errors an ended run's fence writes on its in-flight steps (``lifecycle._fence_steps``).
FENCE_ERROR_TYPES = (_type(WorkflowCancelledError), _type(WorkflowTimeoutError))
SIGNAL_TIMEOUT_TYPE = _type(SignalTimeoutError)


def retry_run(alias: str, run_id: Any, deadline_ms: int | None, *, by_parent: bool = False) -> bool:
    """
    Revive the run ``run_id`` if it is failed, cancelled or parked (``PARKED``): running again,
    due now, its deadline ``deadline_ms`` from now (or none), and the step
    where it stopped given a fresh start (see ``_revive_steps``). False for
    any other status, or when another retry revived it first. An item of a
    halted fan-out is revived only by its parent's retry (``by_parent``).
    """

    runs = WorkflowRun.objects.using(alias)
    fields = ("status", "error", "updated_at", "workflow", "dedup_key", "parent_id", "parent_step_id")
    run = runs.filter(pk=run_id).values(*fields).first()
    if run is None:
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.")
    parked = run["status"] == "suspended" and run["error"] is not None
    if run["status"] not in RETRYABLE_RUN_STATUSES and not parked:
        return False
    if not by_parent and run["parent_step_id"] is not None:
        _refuse_a_halted_item(alias, run_id, run["parent_id"], run["parent_step_id"])
    stopped_at = _stopped_steps(alias, run_id, run["error"])

    def write() -> bool:
        revived = runs.filter(
            Q(status__in=RETRYABLE_RUN_STATUSES) | PARKED, pk=run_id, updated_at=run["updated_at"]
        ).update(
            status="running",
            output=None,
            error=None,
            wake_at=DbNowMs(),
            deadline_at=None if deadline_ms is None else DbNowMs() + deadline_ms,
            swept_at=None,
            sweep_wakes=0,
            sweep_after=None,
            updated_at=DbNow(),
        )
        if not revived:
            return False
        # Due now: idle workers look again once this commits.
        work_due(alias)
        steps = WorkflowStep.objects.using(alias).filter(pk__in=stopped_at, status="failed")
        for step in steps.select_for_update():
            _revive_step(alias, step)
        return True

    try:
        return in_transaction(alias, write)
    except IntegrityError:
        if run["dedup_key"] is None:
            raise
        # Another unfinished run of the workflow holds its dedup key now.
        holder = runs.filter(workflow=run["workflow"], dedup_active=run["dedup_key"]).first()
        raise DuplicateRunError(run["workflow"], run["dedup_key"], holder and holder.pk) from None


def _refuse_a_halted_item(alias: str, run_id: Any, parent_id: Any, step_id: Any) -> None:
    """
    An item of a halted fan-out is not retried on its own: its end was
    counted, and its parent fails its step once the items in flight end.
    """
    if WorkflowFanOut.objects.using(alias).filter(pk=step_id, halted=True).exists():
        raise InvalidArgumentError(
            f"run_id: run {run_id} is an item of a halted fan-out of run {parent_id}; "
            f"retry the parent run {parent_id} instead, which revives every item that did not complete."
        )


def _stopped_steps(alias: str, run_id: Any, error: Any) -> list[Any]:
    """
    The failed steps where the run stopped: those its end fenced (cancelled
    or timed out), the step whose failure failed the run (``error["step"]``),
    or the signal wait whose timeout did. A step that failed earlier and that
    the workflow caught stays failed, so the replay takes the same path.
    """

    error = error if isinstance(error, dict) else {}
    failed = WorkflowStep.objects.using(alias).filter(run_id=run_id, status="failed")
    stopped = Q(error__type__in=FENCE_ERROR_TYPES)
    if error.get("step"):
        stopped |= Q(step_name=error["step"])
    ids = list(failed.filter(stopped).values_list("pk", flat=True))
    if error.get("type") == SIGNAL_TIMEOUT_TYPE:
        timed_out = failed.filter(rpc_name=SIGNAL_RPC, error__type=SIGNAL_TIMEOUT_TYPE)
        last = timed_out.order_by("-updated_at").values_list("pk", flat=True).first()
        if last is not None:
            ids.append(last)
    return ids


def _revive_step(alias: str, step: Any) -> None:
    """
    Give one stopped step a fresh budget of ``retries + 1`` attempts from its
    attempt number on. An ordinary step stays failed with its base raised, so
    the next claim takes it as ``attempt + 1`` and every older attempt stays
    fenced. A sleep, a signal wait or a child step is moved on to its next
    attempt at once (its history row written), back to where it waits: a
    sleep to its wake time, a wait to a fresh window, a child step to pending
    with no child, so the replay starts a new child.
    """

    steps = WorkflowStep.objects.using(alias).filter(pk=step.pk, status="failed", attempt=step.attempt)
    if step.rpc_name in FAN_OUT_RPCS:
        _revive_fan_out(alias, step)
        return
    if step.rpc_name not in (SLEEP_RPC, SIGNAL_RPC, CHILD_RPC):
        steps.update(budget_base=F("attempt"), losses=0)
        return
    attempt = step.attempt + 1
    data = dict(step.data or {})
    fields: dict[str, Any] = {"child_run": None}
    if step.rpc_name == SLEEP_RPC:
        status = "scheduled"
    elif step.rpc_name == SIGNAL_RPC:
        status = "suspended"
        now = _now_ms(alias)
        timeout_ms = data.get("timeout_ms")
        data.update(since=now, until=None if timeout_ms is None else now + int(timeout_ms))
    else:
        status = "pending"
    steps.update(
        status=status,
        attempt=attempt,
        budget_base=attempt - 1,
        losses=0,
        data=data,
        result=None,
        error=None,
        lease_expires_at=None,
        updated_at=DbNow(),
        **fields,
    )
    write_attempt(alias, step.pk, attempt, status)


def _now_ms(alias: str) -> int:

    return Lease.objects.db_manager(alias).db_now_ms()


def fork_run(alias: str, run_id: Any, from_step: str | None) -> Any:
    """
    A new run of the run's workflow and input (``forked_from`` it), with the
    succeeded steps before ``from_step`` (in the original's order) copied as
    succeeded, each with one succeeded attempt, and the stream items and
    events the original had written by then (``store.forks``): the new run
    replays them and runs on from ``from_step`` with today's code.
    """

    runs = WorkflowRun.objects.db_manager(alias)
    original = runs.filter(pk=run_id).first()
    if original is None:
        raise InvalidArgumentError(f"run_id: no workflow run {run_id!r}.")
    steps = list(WorkflowStep.objects.using(alias).filter(run_id=run_id).order_by("created_at", "id"))
    names = [step.step_name for step in steps]
    if from_step is not None and from_step not in names:
        raise InvalidArgumentError(
            f"from_step: run {run_id} has no step {from_step!r}; its steps are {names}."
        )
    before = steps[: names.index(from_step)] if from_step is not None else []

    def write() -> WorkflowRun:
        # The original held for the fork's transaction: a prune that picked
        # it either waits for the fork (and keeps it whole, its fork's
        # forked_from set null) or deleted it first, and the fork says so.
        take_write_lock(alias)
        if not runs.filter(pk=run_id).select_for_update().values_list("pk", flat=True).exists():
            raise InvalidArgumentError(f"run_id: workflow run {run_id!r} was pruned meanwhile.")
        fork = runs.create_run(
            original.workflow, original.input, queue=original.queue, priority=original.priority
        )
        runs.filter(pk=fork.pk).update(forked_from=original)
        fork.forked_from = original
        if before:
            copy_history(alias, run_id, fork, before, steps[len(before) :])
        if before and original.has_patches:
            _copy_markers(alias, original, fork, steps[len(before)].created_at)
        return fork

    return in_transaction(alias, write)


def _copy_markers(alias: str, original: WorkflowRun, fork: WorkflowRun, until: Any) -> None:
    """
    The patch markers the original wrote before its step ``from_step`` (created
    at ``until``): the copied steps took those patches' paths, so the fork
    replays them the same way.
    """
    patches = WorkflowPatch.objects.using(alias)
    names = patches.filter(run=original, created_at__lte=until).values_list("name", flat=True)
    copies = [WorkflowPatch(run=fork, name=name, created_at=until) for name in names]
    if copies:
        patches.bulk_create(copies)
        WorkflowRun.objects.using(alias).filter(pk=fork.pk).update(has_patches=True)
        fork.has_patches = True


def _revive_fan_out(alias: str, step: Any) -> None:
    """
    ``retry_workflow`` of a run stopped at this fan-out step: the step moves
    on to its next attempt, parked again; every item that did not complete
    is revived where it stopped (``retry_run``: a fresh budget for its step)
    and held again; the counts start over from the items that completed, and
    the first ``max_parallel`` of the rest are released. Items that completed
    are not run again.
    """

    attempt = step.attempt + 1
    WorkflowStep.objects.using(alias).filter(pk=step.pk, status="failed", attempt=step.attempt).update(
        status="running",
        attempt=attempt,
        budget_base=attempt - 1,
        result=None,
        error=None,
        lease_expires_at=None,
        updated_at=DbNow(),
    )
    write_attempt(alias, step.pk, attempt, "running", running_at=DbNow())
    items = WorkflowRun.objects.using(alias).filter(parent_step_id=step.pk)
    # Only items that ended without completing are revived and held again;
    # one still in flight is never moved (it ends, and is counted, once).
    undone = list(items.filter(status__in=RETRYABLE_RUN_STATUSES).values_list("pk", flat=True))
    completed = items.filter(status="completed").count()
    for item_id in undone:
        retry_run(alias, item_id, None, by_parent=True)
    items.filter(pk__in=undone).update(status=fanout.HELD, wake_at=None)
    fan_out = WorkflowFanOut.objects.using(alias).select_for_update().get(pk=step.pk)
    in_flight = fan_out.total - completed - len(undone)
    fan_out.halted, fan_out.failed_run = False, None
    fan_out.ended = completed
    fan_out.released = 0
    free = len(undone) if fan_out.max_parallel is None else max(0, fan_out.max_parallel - in_flight)
    for _ in range(min(free, len(undone))):
        fan_out.released = release_next(alias, step.pk, fan_out.released, fan_out.total)
    fan_out.save(using=alias, update_fields=["halted", "failed_run", "ended", "released"])
