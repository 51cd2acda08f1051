"""
What a workflow can do besides a step: sleep, wait for a signal, run a child
workflow. Each is a step of its own kind (its ``rpc_name`` says which), kept in
the store like any other, so a replay finds it where the last pass left it;
while one waits, the run holds no worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.errors import (
    InvalidArgumentError,
    SignalTimeoutError,
    StepFailedError,
    StepFunctionMismatchError,
    WorkflowCancelledError,
)
from pikku_django.managers import ACTIVE_RUN_STATUSES, WOKEN, serialize_error
from pikku_django.managers.fence import RunFence
from pikku_django.managers.signals import SIGNAL_RPC
from pikku_django.managers.steps import write_attempt
from pikku_django.models import WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.sql.conflicts import in_transaction
from pikku_django.store.lifecycle import time_out_runs
from pikku_django.wakeups import work_due
from pikku_django.workflows.registry import child_workflow
from pikku_django.workflows.unwind import PASS_CONTROL as PASS_CONTROL
from pikku_django.workflows.unwind import Stop as Stop
from pikku_django.workflows.unwind import Suspend as Suspend
from pikku_django.workflows.unwind import commits_held_outcome as commits_held_outcome
from pikku_django.workflows.unwind import unwinds_store_errors as unwinds_store_errors

logger = logging.getLogger(__name__)

#: The ``rpc_name`` of a ``ctx.sleep`` step; ``data["wake_at"]`` is when it ends.
SLEEP_RPC = "pikku.sleep"

#: The ``rpc_name`` of a ``ctx.workflow`` step; ``data["workflow"]`` names the child's workflow.
CHILD_RPC = "pikku.workflow"

SIGNAL_TIMEOUT_TYPE = f"{SignalTimeoutError.__module__}.{SignalTimeoutError.__qualname__}"


def suspend_run(run: WorkflowRun, suspend: Suspend, fence: RunFence | None = None) -> None:
    """
    Write a pass's suspension: the run's status and when to wake it (no later
    than its deadline), fenced to the pass's run lease: a pass that lost it
    writes nothing, and the pass that holds it now decides.
    """
    alias = run._state.db or "default"
    runs = WorkflowRun.objects.using(alias).filter(pk=run.pk, status__in=ACTIVE_RUN_STATUSES)
    if fence is not None:
        runs = runs.filter(fence.held(alias))
    wake_at = suspend.wake_at
    if run.deadline_at is not None:
        wake_at = run.deadline_at if wake_at is None else min(wake_at, run.deadline_at)
    if not runs.update(status=suspend.status, wake_at=wake_at, updated_at=DbNow()):
        logger.info("Run %s: the suspension was not written (the run lease was lost or it ended).", run.pk)
        return
    rechecked = suspend.recheck is not None and suspend.recheck()
    if rechecked and runs.update(status="running", wake_at=WOKEN, updated_at=DbNow()):
        work_due(alias)


class WaitsMixin:
    """``ctx.sleep``, ``ctx.wait_for_signal`` and ``ctx.workflow`` (mixed into ``RunContext``)."""

    run: WorkflowRun
    run_id: Any
    _using: str
    _seen: set[str]
    _steps: dict[str, WorkflowStep]
    _signal_waits: dict[str, int]
    _fence: RunFence | None
    # Provided by PatchesMixin: every marker the run holds was asked for before a new step.
    check_markers: Callable[[str], None]

    # -- sleep ------------------------------------------------------------------

    @unwinds_store_errors
    def sleep(self, name: str, ms: int) -> None:
        """
        Wait ``ms`` milliseconds on the database clock, durably: the wake time
        is fixed on the first pass, the run holds no worker meanwhile, and a
        replay after it passes at once.
        """
        validate.name("name", name)
        validate.positive_ms("ms", ms)
        self._use_name(name)
        step = self._special_step(name, SLEEP_RPC, "scheduled", lambda now: {"ms": ms, "wake_at": now + ms})
        if step.status == "succeeded":
            return
        self._stop_unless_waiting(step)
        now = self._check_run()
        wake_at = int(_data(step)["wake_at"])
        if now < wake_at:
            raise Suspend(wake_at, f"step {name!r} sleeps until {wake_at}")
        self._settle(step, "succeeded", result=None)

    # -- signals ------------------------------------------------------------------

    @unwinds_store_errors
    def wait_for_signal(self, name: str, timeout_ms: int | None = None) -> Any:
        """
        The payload of the oldest signal ``name`` sent to this run that no
        earlier wait consumed; until one comes the run is ``suspended`` and
        holds no worker. With ``timeout_ms``, raises ``SignalTimeoutError``
        once the database clock passes the wait's start plus the timeout.
        """
        validate.name("name", name)
        if timeout_ms is not None:
            validate.positive_ms("timeout_ms", timeout_ms)
        count = self._signal_waits[name] = self._signal_waits.get(name, 0) + 1
        step_name = name if count == 1 else f"{name}#{count}"
        validate.name("name", step_name)
        self._use_name(step_name)
        step = self._special_step(
            step_name,
            SIGNAL_RPC,
            "suspended",
            lambda now: {
                "signal": name,
                "since": now,
                "timeout_ms": timeout_ms,
                "until": None if timeout_ms is None else now + timeout_ms,
            },
        )
        if step.status == "succeeded":
            return step.result
        if step.status == "failed" and (step.error or {}).get("type") == SIGNAL_TIMEOUT_TYPE:
            raise SignalTimeoutError(name, int(_data(step)["timeout_ms"]))
        self._stop_unless_waiting(step)
        now = self._check_run()
        signals = WorkflowSignal.objects.db_manager(self._using)
        signal = self._consume(step, name)
        if signal is not None:
            return signal.payload
        until = _data(step).get("until")
        if until is not None and now >= until:
            error = SignalTimeoutError(name, int(_data(step)["timeout_ms"]))
            self._settle(step, "failed", error=serialize_error(error))
            raise error
        run = self.run
        raise Suspend(
            until,
            f"waits for signal {name!r}",
            status="suspended",
            recheck=lambda: signals.waiting_for(run, name),
        )

    def _consume(self, step: WorkflowStep, name: str) -> WorkflowSignal | None:
        """
        The oldest signal ``name`` not yet consumed, consumed and the wait
        settled with it in one transaction: a pass fenced out at the settle
        leaves the signal for the pass that holds the run now.
        """
        signals = WorkflowSignal.objects.db_manager(self._using)
        stored = step.status, step.result, step.error

        def write() -> WorkflowSignal | None:
            # A try the server rolled back settled nothing: the step as it was read.
            step.status, step.result, step.error = stored
            # Fenced, and the first write of the transaction (see take_write_lock).
            self._touch_run()
            signal = signals.consume(step, name)
            if signal is not None:
                self._settle(step, "succeeded", result=signal.payload)
            return signal

        return in_transaction(self._using, write)

    # -- child runs ---------------------------------------------------------------

    @unwinds_store_errors
    def workflow(self, name: str, workflow_name: str, input: Any = None, *, key: str | None = None) -> Any:
        """
        Run the workflow ``workflow_name`` as a child of this run (started
        once, even across replays and crashes) and return its output; a child
        that fails or is cancelled raises ``StepFailedError`` with its error.
        ``key``: the child's flow-control key (its queue's per-key limits).
        """
        validate.name("name", name)
        if key is not None:
            validate.name("key", key)
        child_workflow("workflow_name", workflow_name)
        validate.json_value("input", input)
        self._use_name(name)
        step = self._special_step(name, CHILD_RPC, "pending", lambda now: {"workflow": workflow_name})
        if _data(step).get("workflow") != workflow_name:
            raise StepFunctionMismatchError(
                self.run_id, name, str(_data(step).get("workflow")), workflow_name
            )
        if step.status == "pending":
            self._check_run()
            self._start_child(step, workflow_name, input, key)
            step = WorkflowStep.objects.using(self._using).get(pk=step.pk)
        if step.status == "succeeded":
            return step.result
        if step.status == "failed":
            raise StepFailedError(name, step.attempt, step.error)
        steps = WorkflowStep.objects.using(self._using)
        step_id = step.pk
        raise Suspend(
            None,
            f"waits for child run {step.child_run_id}",
            recheck=lambda: not steps.filter(pk=step_id, status="running").exists(),
        )

    def _start_child(self, step: WorkflowStep, workflow_name: str, input: Any, key: str | None) -> None:
        """
        Start the child and park the step on it in one transaction, guarded by
        the step still being pending with no child: a crash leaves neither or
        both, and a replay never starts a second child.
        """
        alias = self._using

        def write() -> WorkflowRun:
            # The parent is active and this pass's, checked (and its row
            # locked) in the transaction that starts the child.
            self._touch_run()
            # On the parent's queue and priority.
            child = WorkflowRun.objects.db_manager(alias).create_run(
                workflow_name,
                input,
                parent=self.run,
                queue=self.run.queue,
                priority=self.run.priority,
                key=key,
            )
            parked = (
                WorkflowStep.objects.using(alias)
                .filter(pk=step.pk, status="pending", child_run__isnull=True)
                .update(status="running", lease_expires_at=None, child_run=child, updated_at=DbNow())
            )
            if not parked:
                raise _AlreadyStarted
            write_attempt(alias, step.pk, step.attempt, "running", running_at=DbNow())
            return child

        try:
            child = in_transaction(alias, write)
        except _AlreadyStarted:
            return
        logger.info("Run %s started child run %s (%s).", self.run_id, child.pk, workflow_name)

    # -- shared ---------------------------------------------------------------------

    def _use_name(self, name: str) -> None:
        if name in self._seen:
            raise InvalidArgumentError(
                f"name: step {name!r} is used twice in workflow {self.run.workflow!r}; "
                "each step of a run needs a name of its own."
            )
        self._seen.add(name)

    def _special_step(
        self, name: str, rpc_name: str, status: str, data: Callable[[int], dict[str, Any]]
    ) -> WorkflowStep:
        """
        The step ``name`` as stored, created first (in ``status``) if this is
        the first pass to meet it: in one transaction that first touches the
        run under the pass's run lease (a pass that lost it creates nothing),
        and that replays the step another pass created first.
        """
        step = self._steps.get(name)
        if step is None:
            self.check_markers(name)
            now = self._check_run()
            steps = WorkflowStep.objects.db_manager(self._using)

            def write() -> WorkflowStep:
                self._touch_run()
                created = steps.insert_step(self.run, name, rpc_name, data(now), retries=0)
                if status != "pending":
                    steps.filter(pk=created.pk, status="pending").update(status=status)
                    write_attempt(self._using, created.pk, created.attempt, status)
                    created.status = status
                return created

            try:
                step = in_transaction(self._using, write)
            except (IntegrityError, InvalidArgumentError):
                # Another pass created it first ("already a step of run"): replay it as stored.
                step = steps.filter(run_id=self.run_id, step_name=name).first()
                if step is None:
                    raise
            self._steps[name] = step
        if step.rpc_name != rpc_name:
            raise StepFunctionMismatchError(self.run_id, name, step.rpc_name, rpc_name)
        return step

    def _touch_run(self) -> None:
        """
        Inside a transaction: lock the run row while it is active and this
        pass still holds its run lease, or stop the pass. What the transaction
        writes next is then this pass's, and a cancel waits for it.
        """
        runs = WorkflowRun.objects.using(self._using).filter(pk=self.run_id, status__in=ACTIVE_RUN_STATUSES)
        if self._fence is not None:
            runs = runs.filter(self._fence.held(self._using))
        if not runs.update(updated_at=DbNow()):
            raise Stop("the run lease was lost, or the run ended elsewhere")

    def _settle(self, step: WorkflowStep, status: str, *, result: Any = None, error: Any = None) -> None:
        """End a sleep or a wait, guarded by it still waiting (a cancel may have fenced it)."""
        stamp = {"succeeded_at" if status == "succeeded" else "failed_at": DbNow()}
        waiting = WorkflowStep.objects.using(self._using).filter(
            pk=step.pk, status__in=("pending", "scheduled", "suspended")
        )
        if self._fence is not None:
            waiting = waiting.filter(self._fence.held(self._using))
        written = waiting.update(status=status, result=result, error=error, updated_at=DbNow())
        if not written:
            raise Stop(f"step {step.step_name!r} was ended elsewhere")
        write_attempt(self._using, step.pk, step.attempt, status, result=result, error=error, **stamp)
        step.status, step.result, step.error = status, result, error

    def _stop_unless_waiting(self, step: WorkflowStep) -> None:
        if step.status not in ("pending", "scheduled", "suspended"):
            # Fenced by a cancel or a deadline: this pass is stale.
            raise Stop(f"step {step.step_name!r} is {step.status}")

    def _check_run(self) -> int:
        """
        Before a step: stop if the run was cancelled (or ended) elsewhere, and
        time it out if its deadline has passed. Returns the DB clock's now.
        """
        # One prepared read (see sql.attempts.POSTGRESQL_RUN_STATE): it runs before every step.
        row = WorkflowStep.objects.db_manager(self._using).run_state(self.run_id)
        if row is None or row[0] not in ACTIVE_RUN_STATUSES:
            raise Stop("the run was cancelled or ended elsewhere")
        status, deadline_at, now = row
        if deadline_at is not None and now >= deadline_at:
            time_out_runs(self._using, [self.run_id])
            raise Stop("the run passed its deadline")
        return int(now)

    def _check_claimed(self, step: WorkflowStep) -> None:
        """
        After a claim, before the step's function runs: a run cancelled or
        timed out meanwhile gets its step fenced (guarded by this attempt), and
        the function is never called.
        """
        try:
            self._check_run()
        except Stop:
            error = serialize_error(WorkflowCancelledError(self.run_id))
            fenced = (
                WorkflowStep.objects.using(self._using)
                .filter(pk=step.pk, attempt=step.attempt, status="running")
                .update(status="failed", error=error, lease_expires_at=None, updated_at=DbNow())
            )
            if fenced:
                write_attempt(self._using, step.pk, step.attempt, "failed", error=error, failed_at=DbNow())
            raise


def _data(step: WorkflowStep) -> dict[str, Any]:
    data: dict[str, Any] = step.data or {}
    return data


class _AlreadyStarted(Exception):
    """Rolls back a child start whose step another pass parked first."""
