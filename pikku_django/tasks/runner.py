"""
How a worker runs a stored task: the ``pikku_django.task`` workflow, whose
one step is the task's own function, run under the step lease and retried
like any step. Importing this module registers the workflow (the app does so
at startup when ``TASKS`` names this backend).
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from pikku_django.conf import conf
from pikku_django.errors import (
    InvalidArgumentError,
    RaisedBaseExceptionError,
    StepTimeoutError,
    TaskTimeoutError,
    WorkerAbortedError,
)
from pikku_django.managers import serialize_error
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.policy import StepPolicy, load_policy, step_policy
from pikku_django.sql.cursors import read_models
from pikku_django.store.lifecycle import stored_end
from pikku_django.tasks.compat import (
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from pikku_django.tasks.results import TASK_STEP, TASK_WORKFLOW, build_result, read_result, resolve_task
from pikku_django.workflows import workflow
from pikku_django.workflows.context import RunContext
from pikku_django.workflows.registry import FirstStep
from pikku_django.workflows.timeouts import await_within, remaining_s
from pikku_django.workflows.waits import Stop, Suspend

#: The result an attempt starts with is RUNNING whatever its step's lease says:
#: no clock is needed to judge it.
NOT_JUDGED = 0


def _call(task: Any, result: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """
    Call the task's function once: whatever it raises is this attempt's
    error, ``SystemExit`` and ``KeyboardInterrupt`` (``sys.exit()``) too,
    carried out as a ``RaisedBaseExceptionError`` that is stored as the
    original. Only the worker's own abort and the runtime's own unwinding
    pass through.
    """
    try:
        given = (TaskContext(task_result=result), *args) if task.takes_context else tuple(args)
        if remaining_s() is not None and inspect.iscoroutinefunction(task.func):
            # Under a timeout, the coroutine is cancelled at its deadline.
            value = await_within(task.func(*given, **kwargs))
        else:
            value = task.call(*given, **kwargs)
        return normalize_json(value)
    except BaseException as error:
        if isinstance(error, (Exception, WorkerAbortedError, Stop, Suspend)):
            raise
        raise RaisedBaseExceptionError(error) from error


def _past_deadline(error: BaseException | None = None) -> bool:
    """
    Has the attempt this thread runs passed its timeout, or raised by it?
    Its outcome is then the lane's to tell (``timed_out``).
    """
    left = remaining_s()
    return left is not None and (left <= 0 or isinstance(error, StepTimeoutError))


def _started(task: Any, alias: str, ctx: RunContext) -> Any:
    """
    The result ``task_started`` carries, the run as the worker's take read
    it. A first attempt the take claimed is the step's only attempt, its
    ``running_at`` the step's ``updated_at`` as the claim wrote it: built
    from that step with no read. Otherwise one read, of the step's attempts.
    """
    step = ctx.in_hand
    if step is None or step.step_name != TASK_STEP or step.attempt != 1:
        return read_result(task, alias, ctx.run, NOT_JUDGED)
    first = WorkflowStepAttempt(
        step=step, attempt=1, status="running", holder=ctx.holder or "", running_at=step.updated_at
    )
    return build_result(task, alias, ctx.run, step, [first], NOT_JUDGED)


def _last_attempt(ctx: RunContext, policy: StepPolicy | None, error: Exception) -> bool:
    """
    Would the attempt now raising spend the task's budget? Judged on its
    step as the claim will judge it once the failure is recorded (only
    attempts that raised count against ``retries``; a retry_workflow gives a
    fresh budget), or by its ``policy`` (an error it does not retry, a
    backoff that answers None).
    """
    step = WorkflowStep.objects.using(ctx.run._state.db).get(run_id=ctx.run_id, step_name=TASK_STEP)
    if policy is not None and policy.verdict(step.attempt, error).final:
        return True
    step.status = "failed"
    return step.is_exhausted


def _finished(task_result: Any, run: WorkflowRun, status: Any) -> Any:
    """A copy of ``task_result`` ended with ``status``; its ``finished_at`` is the run's end as stored."""
    finished_at = stored_end(run)
    if finished_at is None:
        # An end its pass did not write (none does today): one read.
        alias = run._state.db or DEFAULT_DB_ALIAS
        run_id = WorkflowRun._meta.pk.get_db_prep_value(run.pk, connections[alias])
        (read,) = read_models(WorkflowRun, alias, "run_updated_at", {"run_id": run_id})
        finished_at = read.updated_at
    done = copy.copy(task_result)
    object.__setattr__(done, "status", status)
    object.__setattr__(done, "finished_at", finished_at)
    return done


def _when_failed(task_result: Any, error: Exception, sender: type) -> Any:
    """
    What sends ``task_finished`` FAILED for the task's last attempt, which
    raised ``error``: called once the run's failure has committed (one commit
    with the attempt's, issue 14), so a result is never reported done before
    its outcome is stored. It is sent with ``error`` active, as from inside
    its ``except`` (Django's own receiver logs it with ``logger.exception``).
    """
    stored = serialize_error(error)

    def send(run: WorkflowRun) -> None:
        done = _finished(task_result, run, TaskResultStatus.FAILED)
        error_row = TaskError(exception_class_path=stored["type"], traceback=stored["traceback"])
        object.__setattr__(done, "errors", [*task_result.errors, error_row])
        try:
            raise error
        except Exception:
            task_finished.send(sender=sender, task_result=done)

    return send


def _when_done(task_result: Any, value: Any, sender: type) -> Any:
    """
    What sends ``task_finished`` SUCCESSFUL for the attempt that returned
    ``value``: called once the run's completion has committed, so a result
    is never reported done before its outcome is stored. Its ``finished_at``
    is the run's end as its outcome stored it (``_finished``).
    """

    def send(run: WorkflowRun) -> None:
        done = _finished(task_result, run, TaskResultStatus.SUCCESSFUL)
        object.__setattr__(done, "errors", list(task_result.errors))
        object.__setattr__(done, "_return_value", value)
        task_finished.send(sender=sender, task_result=done)

    return send


def _first_step(run: WorkflowRun) -> FirstStep | None:
    """
    A task's one step, claimed by the worker's take in its own commit: the
    step's function is the task's path, its lease the backend's (as
    ``run_task`` claims it).
    """
    stored = run.input if isinstance(run.input, dict) else {}
    lease_ms = stored.get("lease_ms")
    try:
        task = resolve_task(stored.get("task"))
    except InvalidArgumentError:
        # The pass fails the run for it, and the step is never claimed.
        return None
    lease = conf.STEP_LEASE_MS if lease_ms is None else int(lease_ms)
    return FirstStep(TASK_STEP, task.module_path, lease, only=True)


@workflow(TASK_WORKFLOW, internal=True, first_step=_first_step)
def run_task(ctx: RunContext, input: dict[str, Any]) -> Any:
    """Run the stored task once per attempt; its return value is the run's output."""
    task = resolve_task(input["task"])
    alias = input["backend"]
    sender = type(task_backends[alias])
    args, kwargs = input["args"], input["kwargs"]
    # The task's policy as its enqueue stored it (none stored: judged as before).
    options = load_policy(input["policy"]) if "policy" in input else {}
    # Its budget of lost workers, whoever inserts the step (enqueue, or this
    # pass when enqueue died between its two INSERTs); a run stored without
    # one has its backend's.
    worker_losses = input.get("worker_losses", getattr(task_backends[alias], "worker_losses", None))
    policy = step_policy(**options, worker_losses=worker_losses) if "policy" in input else None
    ctx.timeout_error = TaskTimeoutError

    # Named after the task's function, so the step's rpc_name is the task's
    # path, and a replay with any other function is refused.
    started: list[Any] = []

    @functools.wraps(task.func)
    def attempt() -> Any:
        result = _started(task, alias, ctx)
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        started[:] = [result]
        task_started.send(sender=sender, task_result=result)
        try:
            value = _call(task, result, args, kwargs)
        except Exception as error:
            # An attempt past its timeout is told by the lane (``timed_out``).
            if not _past_deadline(error) and _last_attempt(ctx, policy, error):
                # Its last attempt: FAILED once the run's failure commits.
                ctx.on_failed(_when_failed(result, error, sender))
            raise
        if not _past_deadline():
            # This pass ran the successful attempt: SUCCESSFUL once its outcome commits.
            ctx.on_completed(_when_done(result, value, sender))
        return value

    def timed_out(error: StepTimeoutError) -> None:
        """The lane failed the attempt by its timeout: FAILED, if that was its last."""
        if started and _last_attempt(ctx, policy, error):
            ctx.on_failed(_when_failed(started[0], error, sender))

    ctx.on_timeout = timed_out

    return ctx.step(
        TASK_STEP,
        attempt,
        retries=input["retries"],
        lease_ms=input.get("lease_ms"),
        worker_losses=worker_losses,
        **options,
    )


__all__ = ["TASK_STEP", "TASK_WORKFLOW", "run_task"]
