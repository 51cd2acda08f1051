"""Starting runs: ``start_workflow``, and driving one inline to its end."""

from __future__ import annotations

import functools
import time
from typing import Any

from pikku_django import validate
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers import FINISHED_RUN_STATUSES
from pikku_django.managers.base import write_alias
from pikku_django.models import DEFAULT_QUEUE, Lease, WorkflowRun
from pikku_django.store.debounce import DEBOUNCE_MODES, DebounceMode, start_debounced
from pikku_django.store.dedup import DEDUP_MODES, DedupMode, start_deduplicated
from pikku_django.workflows import tracing
from pikku_django.workflows.registry import get_workflow
from pikku_django.workflows.runner import run_workflow


def start_workflow(
    name: str,
    input: Any = None,
    *,
    inline: bool = False,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    idempotency_key: str | None = None,
    timeout_ms: int | None = None,
    key: str | None = None,
    dedup_key: str | None = None,
    dedup: DedupMode = "return",
    debounce_ms: int | None = None,
    debounce_max_ms: int | None = None,
    debounce_mode: DebounceMode = "last",
    using: str | None = None,
) -> WorkflowRun:
    """
    Start a run of the workflow ``name`` on ``queue``, due at once for a
    worker (higher ``priority`` first); with ``inline=True``, drive it to its
    end here first. A failed run is returned, not raised. A second start with
    the same ``idempotency_key`` returns the first run, whatever its status;
    ``timeout_ms`` sets a deadline on the database clock. Flow control
    (docs/flow-control.md): ``key``, the run's tenant or entity; ``dedup_key``,
    one unfinished run of ``name`` under it (``store.dedup``); ``debounce_ms``,
    starts with one ``key`` make one run (``store.debounce``). ``using``:
    the database (default: the router's ``db_for_write``).
    """
    get_workflow(validate.name("name", name))
    validate.json_value("input", input)
    validate.queue_name("queue", queue)
    validate.priority("priority", priority)
    if timeout_ms is not None:
        validate.positive_ms("timeout_ms", timeout_ms)
    if idempotency_key is not None:
        validate.name("idempotency_key", idempotency_key)
    _check_flow(key, dedup_key, dedup, debounce_ms, debounce_max_ms, debounce_mode, idempotency_key)
    alias = write_alias(WorkflowRun, using)
    options: dict[str, Any] = {"queue": queue, "priority": priority, "timeout_ms": timeout_ms, "key": key}
    flow: dict[str, Any] = {"dedup_key": dedup_key, "dedup": dedup, "idempotency_key": idempotency_key}
    if debounce_ms is not None:
        flow["debounce"] = {"debounce_ms": debounce_ms, "debounce_max_ms": debounce_max_ms}
        flow["debounce"]["mode"] = debounce_mode
    with tracing.enqueue(name, queue) as traced:
        options["trace_context"] = traced.context
        run = _start(alias, name, input, options, **flow)
        traced.started(run)
    return _drive_inline(run) if inline else run


def _start(
    alias: str,
    name: str,
    input: Any,
    options: dict[str, Any],
    *,
    dedup_key: str | None,
    dedup: DedupMode,
    idempotency_key: str | None,
    debounce: dict[str, Any] | None = None,
) -> WorkflowRun:
    """The new run (or the one a dedup, debounce or idempotency key returns)."""
    runs = WorkflowRun.objects.db_manager(alias)
    if debounce is not None and options["key"] is not None:
        return _start_debounced(alias, name, options["key"], input, debounce, options)
    if dedup_key is not None:
        create_one = functools.partial(
            runs.create_run, name, input, idempotency_key=idempotency_key, dedup_key=dedup_key, **options
        )
        run = start_deduplicated(alias, create_one, name, dedup_key, dedup, idempotency_key)
        if idempotency_key is not None and run.workflow != name:
            raise InvalidArgumentError(
                f"idempotency_key {idempotency_key!r} already started a run of workflow {run.workflow!r}, "
                f"not {name!r}; use another key."
            )
        return run
    if idempotency_key is None:
        return runs.create_run(name, input, **options)
    return runs.start_run(name, input, idempotency_key=idempotency_key, **options)


def _start_debounced(
    alias: str, name: str, key: str, input: Any, debounce: dict[str, Any], options: dict[str, Any]
) -> WorkflowRun:
    """A debounced start (``store.debounce``): the key's open run joined, or a new one."""
    runs = WorkflowRun.objects.db_manager(alias)

    def create(value: Any, wake_at: int, until: int) -> WorkflowRun:
        return runs.create_run(name, value, wake_at=wake_at, debounce_until=until, **options)

    return start_debounced(alias, name, key, input, create=create, **debounce)


def _check_flow(
    key: str | None,
    dedup_key: str | None,
    dedup: object,
    debounce_ms: int | None,
    debounce_max_ms: int | None,
    debounce_mode: object,
    idempotency_key: str | None,
) -> None:
    """``start_workflow``'s flow-control arguments, refused before any SQL, each error naming its argument."""
    if key is not None:
        validate.name("key", key)
    if dedup_key is not None:
        validate.name("dedup_key", dedup_key)
    if dedup not in DEDUP_MODES:
        raise InvalidArgumentError(f"dedup must be one of {DEDUP_MODES}, not {dedup!r}.")
    if debounce_mode not in DEBOUNCE_MODES:
        raise InvalidArgumentError(f"debounce_mode must be one of {DEBOUNCE_MODES}, not {debounce_mode!r}.")
    if debounce_max_ms is not None:
        validate.positive_ms("debounce_max_ms", debounce_max_ms)
        if debounce_ms is None:
            raise InvalidArgumentError("debounce_max_ms needs debounce_ms.")
    if debounce_ms is None:
        return
    validate.positive_ms("debounce_ms", debounce_ms)
    if key is None:
        raise InvalidArgumentError("debounce_ms needs a key: the starts of one key make one run.")
    if dedup_key is not None or idempotency_key is not None:
        raise InvalidArgumentError(
            "debounce_ms cannot be combined with dedup_key or idempotency_key: a debounced start "
            "already joins the key's open run."
        )


def _drive_inline(run: WorkflowRun) -> WorkflowRun:
    """Drive the run here until it ends, or waits for something no pass here can bring (a signal)."""
    while True:
        run = run_workflow(run.pk, using=run._state.db)
        if run.is_finished:
            return run
        if run.wake_at is None:
            # Waiting on a child, or on the items of a fan-out: drive the child
            # (or the next due item) inline too; the last end wakes this run.
            children = WorkflowRun.objects.using(run._state.db).filter(parent=run)
            child = (
                children.filter(parent_steps__run=run, parent_steps__status="running")
                .exclude(status__in=FINISHED_RUN_STATUSES)
                .first()
            ) or children.filter(parent_step__isnull=False, status="running").order_by("parent_index").first()
            if child is None or not _drive_inline(child).is_finished:
                return run
            continue
        wait_ms = run.wake_at - Lease.objects.db_manager(run._state.db).db_now_ms()
        if wait_ms > 0:
            time.sleep(wait_ms / 1000)
