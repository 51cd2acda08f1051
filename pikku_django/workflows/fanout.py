"""
Fan-out and fan-in: ``ctx.map`` calls a function once per item, each item a
run of its own with one step (its own lease, attempts and fence) that any
free worker takes; ``ctx.workflows`` starts one child run per input. Either
way the parent's step is parked (running, no lease) and the parent holds no
worker until the last item's end wakes it (``managers.fanout``). A replay
returns the stored list.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import IntegrityError
from django.db.models import F

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.errors import InvalidArgumentError, StepFailedError
from pikku_django.managers.steps import write_attempt
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.models.fanout import FanOutKind, WorkflowFanOut
from pikku_django.policy import dump_policy, step_policy
from pikku_django.sql.conflicts import in_transaction
from pikku_django.store import fanout as store
from pikku_django.store.fanout import MAP_RPC, WORKFLOWS_RPC
from pikku_django.workflows.fanout_items import (
    MAP_ITEM_WORKFLOW,
    ItemKey,
    checked_max_parallel,
    fan_out_fits,
    function_path,
    item_keys,
    json_list,
    results_fit,
    values_digest,
)
from pikku_django.workflows.registry import child_workflow
from pikku_django.workflows.waits import Stop, Suspend, _data, unwinds_store_errors

logger = logging.getLogger(__name__)


class FanOutMixin:
    """``ctx.map`` and ``ctx.workflows`` (mixed into ``RunContext``)."""

    run: WorkflowRun
    run_id: Any
    _using: str

    # Provided by WaitsMixin.
    _use_name: Callable[[str], None]
    _special_step: Callable[..., WorkflowStep]
    _touch_run: Callable[[], None]
    _check_run: Callable[[], int]
    _settle: Callable[..., None]

    @unwinds_store_errors
    def map(
        self,
        name: str,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        *,
        max_parallel: int | None = None,
        retries: int | None = None,
        retry_delay: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        backoff: Any = None,
        retry_on: Any = None,
        timeout_ms: int | None = None,
        worker_losses: int | None = None,
        key: ItemKey = None,
    ) -> list[Any]:
        """
        ``fn(item)`` for each item of ``items``, each a step of its own run
        that any free worker takes, at most ``max_parallel`` at once; the
        results in the order of ``items``. ``retries``, ``retry_delay``,
        ``lease_ms`` and the policy options (``max_attempts`` ...
        ``worker_losses``) are each item's, as for ``ctx.step``. Once an item's
        attempts are spent, no further item starts, and ``StepFailedError``
        is raised here when the items in flight have ended. ``key``: each
        item run's flow-control key, a string or a function of the item.
        """
        validate.name("name", name)
        path = function_path("fn", fn)
        values = json_list("items", items)
        limit = checked_max_parallel(max_parallel)
        keys = item_keys(key, values)
        options: dict[str, Any] = {}
        if retries is not None:
            options["retries"] = validate.retries("retries", retries)
        if retry_delay is not None:
            options["retry_delay"] = validate.retry_delay("retry_delay", retry_delay)
        if lease_ms is not None:
            options["lease_ms"] = validate.positive_ms("lease_ms", lease_ms)
        policy = step_policy(
            retries=retries,
            max_attempts=max_attempts,
            backoff=backoff,
            retry_on=retry_on,
            timeout_ms=timeout_ms,
            worker_losses=worker_losses,
        )
        if policy is not None:
            given = {"max_attempts": policy.max_attempts, "worker_losses": policy.worker_losses}
            options.update({key: value for key, value in given.items() if value is not None})
            options["policy"] = dump_policy(policy)
        results_fit(len(values))
        item = {"fn": path, "step": name, "of": len(values), **({"options": options} if options else {})}
        inputs = [{**item, "item": value} for value in values]
        return self._fan_out(
            name, MAP_RPC, FanOutKind.MAP, MAP_ITEM_WORKFLOW, inputs, values, limit, {"fn": path}, keys
        )

    @unwinds_store_errors
    def workflows(
        self,
        name: str,
        workflow_name: str,
        inputs: Sequence[Any],
        *,
        max_parallel: int | None = None,
        key: ItemKey = None,
    ) -> list[Any]:
        """
        One child run of ``workflow_name`` per input (each started exactly
        once), at most ``max_parallel`` unfinished at once; their outputs in
        order. A child that fails or is cancelled cancels its unfinished
        siblings, and ``StepFailedError`` is raised here. ``key``: each
        child's flow-control key, a string or a function of its input.
        """
        validate.name("name", name)
        child_workflow("workflow_name", workflow_name)
        values = json_list("inputs", inputs)
        limit = checked_max_parallel(max_parallel)
        keys = item_keys(key, values)
        return self._fan_out(
            name, WORKFLOWS_RPC, FanOutKind.WORKFLOWS, workflow_name, values, values, limit,
            {"workflow": workflow_name}, keys,
        )  # fmt: skip

    # -- the step -------------------------------------------------------------------

    def _fan_out(
        self,
        name: str,
        rpc_name: str,
        kind: str,
        workflow_name: str,
        inputs: list[Any],
        values: list[Any],
        max_parallel: int | None,
        target: dict[str, str],
        keys: list[str | None] | None = None,
    ) -> list[Any]:
        argument = "items" if kind == FanOutKind.MAP else "inputs"
        self._use_name(name)
        digest = values_digest(values)
        step = self._special_step(
            name,
            rpc_name,
            "pending",
            lambda now: {**target, "count": len(values), "digest": digest, "max_parallel": max_parallel},
        )
        fan_out_fits(self.run_id, name, _data(step), target, values, argument)
        if step.status == "pending":
            self._check_run()
            if not inputs:
                self._settle(step, "succeeded", result=[])
                return []
            self._start_items(step, kind, workflow_name, inputs, max_parallel, keys)
            step = WorkflowStep.objects.using(self._using).get(pk=step.pk)
        if step.status == "succeeded":
            return list(step.result or [])
        if step.status == "failed":
            raise StepFailedError(name, step.attempt, step.error)
        fan_outs = WorkflowFanOut.objects.using(self._using)
        fan_out = fan_outs.get(pk=step.pk)
        if fan_out.is_done:
            return self._gather(step, fan_out)
        step_id = step.pk
        raise Suspend(
            None,
            f"waits for {fan_out.total - fan_out.ended} of the {fan_out.total} items of step {name!r}",
            recheck=lambda: fan_outs.filter(pk=step_id, ended__gte=F("total")).exists(),
        )

    def _start_items(
        self,
        step: WorkflowStep,
        kind: str,
        workflow_name: str,
        inputs: list[Any],
        max_parallel: int | None,
        keys: list[str | None] | None,
    ) -> None:
        """
        Insert the items' runs in batches, each batch one transaction fenced
        to this pass's run lease (a crash between batches leaves whole
        batches, and the next pass goes on after them); then, in one more,
        park the step, count the fan-out and release the first items.
        """
        alias = self._using
        runs = WorkflowRun.objects.using(alias)
        try:
            start = runs.filter(parent_step=step).count()
            for first in range(start, len(inputs), store.INSERT_BATCH):
                batch = inputs[first : first + store.INSERT_BATCH]
                batch_keys = None if keys is None else keys[first : first + store.INSERT_BATCH]
                insert = functools.partial(self._insert_batch, step, workflow_name, batch, first, batch_keys)
                in_transaction(alias, insert)
        except IntegrityError:
            raise Stop(f"another pass inserted the items of step {step.step_name!r}") from None
        released = len(inputs) if max_parallel is None else min(max_parallel, len(inputs))

        def park() -> None:
            self._touch_run()
            parked = (
                WorkflowStep.objects.using(alias)
                .filter(pk=step.pk, status="pending")
                .update(status="running", lease_expires_at=None, updated_at=DbNow())
            )
            if not parked:
                raise Stop(f"step {step.step_name!r} was started elsewhere")
            write_attempt(alias, step.pk, step.attempt, "running", running_at=DbNow())
            WorkflowFanOut.objects.using(alias).create(
                step=step, kind=kind, total=len(inputs), max_parallel=max_parallel, released=released
            )
            store.release_first(alias, step.pk, released)

        in_transaction(alias, park)
        logger.info(
            "Run %s fanned out step %r: %s items of %s.",
            self.run_id,
            step.step_name,
            len(inputs),
            workflow_name,
        )

    def _insert_batch(
        self,
        step: WorkflowStep,
        workflow_name: str,
        batch: list[Any],
        first: int,
        keys: list[str | None] | None,
    ) -> None:
        """One batch of the items' runs, in the caller's transaction, fenced to this pass's run lease."""
        self._touch_run()
        store.insert_items(self._using, self.run, step, workflow_name, batch, first, keys)

    def _gather(self, step: WorkflowStep, fan_out: WorkflowFanOut) -> list[Any]:
        """All ended: the step succeeds with their results in order, or fails with the first failure."""
        if fan_out.halted:
            error = store.failed_item(self._using, fan_out)
            self._settle_parked(step, "failed", error=error)
            raise StepFailedError(step.step_name, step.attempt, error)
        results = store.outputs(self._using, step.pk)
        try:
            validate.json_value("result", results)
        except InvalidArgumentError as error:
            stored: dict[str, object] = {
                "type": "builtins.ValueError",
                "message": f"The results cannot be stored: {error}",
            }
            self._settle_parked(step, "failed", error=stored)
            raise StepFailedError(step.step_name, step.attempt, stored) from None
        self._settle_parked(step, "succeeded", result=results)
        return results

    def _settle_parked(
        self, step: WorkflowStep, status: str, *, result: Any = None, error: Any = None
    ) -> None:
        """End the parked step, fenced to this pass's run lease (a stale pass writes nothing)."""
        stamp = {"succeeded_at" if status == "succeeded" else "failed_at": DbNow()}

        def write() -> None:
            self._touch_run()
            written = (
                WorkflowStep.objects.using(self._using)
                .filter(pk=step.pk, status="running", lease_expires_at__isnull=True)
                .update(status=status, result=result, error=error, updated_at=DbNow())
            )
            if not written:
                raise Stop(f"step {step.step_name!r} was ended elsewhere")
            write_attempt(self._using, step.pk, step.attempt, status, result=result, error=error, **stamp)

        in_transaction(self._using, write)
        step.status, step.result, step.error = status, result, error
