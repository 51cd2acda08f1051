"""
``ctx.set_event`` and ``ctx.publish``: what a workflow tells its readers,
exactly once across replays and crashes. Each is a step of the run of its own
kind (``pikku.event``, ``pikku.publish``), inserted already succeeded in the
transaction that writes the event or the item and that first touches the run
under the pass's run lease: a pass that lost its lease writes nothing, a
crash leaves both or neither, and a replay meets the step and writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pikku_django import validate
from pikku_django.clock import DbNow
from pikku_django.errors import StepFunctionMismatchError
from pikku_django.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.store.events import EVENT_RPC, PUBLISH_RPC, append_item, fenced_write, put_event
from pikku_django.workflows.unwind import unwinds_store_errors


def emit_step_name(kind: str, name: str, count: int) -> str:
    """
    The step name of the ``count``-th ``kind`` of ``name`` in a run (the same on
    every replay); a name too long for a step's is replaced by its digest.
    """
    full = f"{kind}:{name}#{count}"
    if len(full) <= validate.MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]
    return f"{kind}:{digest}#{count}"


class EmitsMixin:
    """``ctx.set_event`` and ``ctx.publish`` (mixed into ``RunContext``)."""

    run: WorkflowRun
    run_id: Any
    _using: str
    _steps: dict[str, WorkflowStep]
    _emit_counts: dict[tuple[str, str], int]

    # Provided by WaitsMixin.
    _use_name: Callable[[str], None]
    _touch_run: Callable[[], None]

    @unwinds_store_errors
    def set_event(self, key: str, value: Any) -> None:
        """
        Make ``value`` (JSON) the run's event ``key``, its last value for
        ``get_event`` readers; once per call, however often the run replays.
        """
        validate.name("key", key)
        validate.json_value("value", value)
        alias, run_id = self._using, self.run_id

        def write() -> Any:
            put_event(alias, run_id, key, value)
            # The step keeps the value: a fork from a later step knows what the key held.
            return value

        self._emit(EVENT_RPC, "event", key, {"key": key}, write)

    @unwinds_store_errors
    def publish(self, stream: str, item: Any) -> int:
        """
        Append ``item`` (JSON) to the run's ``stream``, once per call however
        often the run replays; returns its offset (0, 1, 2, ... per stream).
        """
        validate.name("stream", stream)
        validate.json_value("item", item)
        alias, run_id = self._using, self.run_id
        offset = self._emit(
            PUBLISH_RPC,
            "publish",
            stream,
            {"stream": stream},
            lambda: append_item(alias, run_id, stream, item),
        )
        return int(offset)

    def _emit(
        self, rpc_name: str, kind: str, name: str, data: dict[str, Any], write: Callable[[], Any]
    ) -> Any:
        """
        The result of this call's step (``write()``'s, stored): replayed when
        the step is stored, else ``write()`` and the step's insert committed
        together under the run lease.
        """
        counts = self._emit_counts
        count = counts[(kind, name)] = counts.get((kind, name), 0) + 1
        step_name = emit_step_name(kind, name, count)
        self._use_name(step_name)
        step = self._steps.get(step_name)
        if step is None:
            step = fenced_write(self._using, lambda: self._write_emit(step_name, rpc_name, data, write))
            self._steps[step_name] = step
        if step.rpc_name != rpc_name:
            raise StepFunctionMismatchError(self.run_id, step_name, step.rpc_name, rpc_name)
        return step.result

    def _write_emit(
        self, step_name: str, rpc_name: str, data: dict[str, Any], write: Callable[[], Any]
    ) -> WorkflowStep:
        # The run row, locked while this pass holds its lease (or the pass stops).
        self._touch_run()
        steps = WorkflowStep.objects.using(self._using)
        found = steps.filter(run_id=self.run_id, step_name=step_name).first()
        if found is not None:
            # Written by a pass that held the run before this one read its steps.
            return found
        result = write()
        step = WorkflowStep(
            run_id=self.run_id,
            step_name=step_name,
            rpc_name=rpc_name,
            data=data,
            status="succeeded",
            result=result,
            retries=0,
            attempt=1,
            created_at=DbNow(),
            updated_at=DbNow(),
        )
        step.save(force_insert=True, using=self._using)
        WorkflowStepAttempt.objects.using(self._using).create(
            step=step,
            attempt=1,
            status="succeeded",
            result=result,
            created_at=DbNow(),
            running_at=DbNow(),
            succeeded_at=DbNow(),
        )
        return step


__all__ = ["EVENT_RPC", "PUBLISH_RPC", "EmitsMixin", "emit_step_name"]
