"""
The store of workflow runs: create and start a run, the stalled runs; the
selections of runs are ``managers.run_queries``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models

from pikku_django import validate
from pikku_django.clock import DbNow, DbNowMs, as_stored, epoch_ms, local_now
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import (
    write_alias,
)
from pikku_django.managers.starts import idempotency_winner
from pikku_django.managers.starts import refuse_internal as refuse_internal
from pikku_django.managers.versions import code_version
from pikku_django.sql.conflicts import in_transaction
from pikku_django.wakeups import work_due

if TYPE_CHECKING:
    from pikku_django.models import WorkflowRun

from pikku_django.managers.run_queries import WorkflowRunQuerySet


class WorkflowRunManager(models.Manager["WorkflowRun"]):
    """The store of workflow runs."""

    def get_queryset(self) -> WorkflowRunQuerySet:
        return WorkflowRunQuerySet(self.model, using=self._db)

    def running(self) -> WorkflowRunQuerySet:
        return self.get_queryset().running()

    def due(self) -> WorkflowRunQuerySet:
        return self.get_queryset().due()

    def create_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        wake_at: int | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
        parent: WorkflowRun | None = None,
        internal: bool = False,
        trace_context: dict[str, str] | None = None,
        key: str | None = None,
        dedup_key: str | None = None,
        debounce_until: int | None = None,
    ) -> WorkflowRun:
        """
        A new run of ``workflow`` on ``queue``, running and due at once (or at
        ``wake_at``, epoch ms judged on the database clock); with
        ``timeout_ms``, a deadline that long after now on the database clock.
        A used ``idempotency_key`` raises IntegrityError (see ``start_run``).
        It is one INSERT on the manager's connection, so inside
        ``transaction.atomic()`` it commits or rolls back with the caller's
        own writes. An internal workflow's runs (the Tasks backend's) need
        ``internal=True``. The rest: tracing's (``workflows.tracing``) and flow control's.
        """
        refuse_internal(workflow, internal)
        _check_names(wake_at=wake_at, idempotency_key=idempotency_key, key=key, dedup_key=dedup_key)
        # Where the database clock is this process's own, nothing is read back.
        alias = write_alias(self.model, self._db)
        here = local_now(connections[alias])
        now_ms: Any = DbNowMs() if here is None else epoch_ms(here)
        now_dt: Any = DbNow() if here is None else as_stored(here)
        deadline = None if timeout_ms is None else now_ms + validate.positive_ms("timeout_ms", timeout_ms)
        version = code_version(workflow)
        run = self.model(
            workflow=validate.name("workflow", workflow),
            code_version=version,
            driven_version=version,
            input=validate.json_value("input", input),
            queue=validate.queue_name("queue", queue),
            priority=validate.priority("priority", priority),
            status="running",
            wake_at=now_ms if wake_at is None else wake_at,
            idempotency_key=idempotency_key,
            key=key,
            dedup_key=dedup_key,
            debounce_until=debounce_until,
            deadline_at=deadline,
            parent=parent,
            trace_context=trace_context,
            created_at=now_dt,
            updated_at=now_dt,
        )
        run.save(force_insert=True, using=alias)
        if here is None:
            run.refresh_from_db(using=alias, fields=["wake_at", "deadline_at", "created_at", "updated_at"])
        return _due_now(run, alias) if wake_at is None else run

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str,
        timeout_ms: int | None = None,
        queue: str = "default",
        priority: int = 0,
        trace_context: dict[str, str] | None = None,
        key: str | None = None,
    ) -> WorkflowRun:
        """
        The run of ``idempotency_key``: created by the first call, returned
        (whatever its status) by every later one, also when processes race:
        the unique key decides, not a read. Another workflow under the key is
        refused.
        """
        validate.name("idempotency_key", idempotency_key)
        refuse_internal(workflow, internal=False)
        alias = write_alias(self.model, self._db)
        runs = self.get_queryset().using(alias)
        run = runs.filter(idempotency_key=idempotency_key).first()
        if run is None:
            try:
                # A savepoint inside a caller's transaction, so a lost race leaves it usable.
                run = in_transaction(
                    alias,
                    lambda: self.db_manager(alias).create_run(
                        workflow,
                        input,
                        idempotency_key=idempotency_key,
                        timeout_ms=timeout_ms,
                        queue=queue,
                        priority=priority,
                        trace_context=trace_context,
                        key=key,
                    ),
                )
            except IntegrityError:
                run = idempotency_winner(runs, alias, idempotency_key)
        if run.workflow != workflow:
            raise InvalidArgumentError(
                f"idempotency_key {idempotency_key!r} already started a run of workflow {run.workflow!r}, "
                f"not {workflow!r}; use another key."
            )
        return run

    def stalled(self, idle_ms: int, limit: int = 100) -> list[Any]:
        """
        Ids of running runs, oldest activity first, with no step in flight,
        nothing touched for ``idle_ms`` on the database clock, and not due
        later. In flight means scheduled, suspended, or running under a live
        or NULL (parked) lease; a lapsed lease is a dead worker and is not in
        flight. Due later means waiting by design (``due_later()``).
        """
        validate.whole("limit", limit, minimum=1, maximum=validate.MAX_INTEGER)
        return list(
            self.get_queryset().idle(idle_ms).order_by("updated_at").values_list("pk", flat=True)[:limit]
        )


def _check_names(
    *, wake_at: int | None, idempotency_key: str | None, key: str | None, dedup_key: str | None
) -> None:
    """``create_run``'s optional arguments, each refused by name before any SQL."""
    if wake_at is not None:
        validate.whole("wake_at", wake_at)
    for name, value in (("idempotency_key", idempotency_key), ("key", key), ("dedup_key", dedup_key)):
        if value is not None:
            validate.name(name, value)


def _due_now(run: WorkflowRun, alias: str) -> WorkflowRun:
    """A run due at once: the workers that wait for work hear of it (``wakeups.work_due``)."""
    work_due(alias)
    return run
