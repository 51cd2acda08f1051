"""Workflow runs, their steps, the steps' attempts, and signals."""

from __future__ import annotations

import datetime
import uuid

from django.db import models
from django.db.models import Case, F, Q, Value, When

from pikku_django import validate
from pikku_django.managers import WorkflowRunManager, WorkflowSignalManager, WorkflowStepManager
from pikku_django.models.fields import ExactCharField, PartialIndex

#: The queue of a run started without one.
DEFAULT_QUEUE = "default"

#: The workflow every Django task's run is stored as (its task's dotted path is the input's "task").
TASK_WORKFLOW = "pikku_django.task"

#: Queue names are at most this long (a queue's slot lease keys must fit in 255).
MAX_QUEUE_LENGTH = validate.MAX_QUEUE_LENGTH


class RunStatus(models.TextChoices):
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The statuses of a run that has not ended (a fan-out's held item is suspended).
UNFINISHED_STATUSES = ("running", "suspended")


class StepStatus(models.TextChoices):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUSPENDED = "suspended"


class WorkflowRun(models.Model):
    """
    One run of a workflow. ``wake_at`` (epoch ms on the database clock) says
    when a worker should drive it next; a run is due once ``wake_at`` <= now.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    wake_at = models.BigIntegerField(
        null=True, blank=True, help_text="Epoch ms on the database clock; NULL once finished."
    )
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH, default=DEFAULT_QUEUE)
    priority = models.IntegerField(default=0, help_text="Higher runs first; then the earlier wake_at.")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # The sweep's back-off, kept here so every sweeping node shares it.
    swept_at = models.DateTimeField(null=True, blank=True, help_text="When a sweep last woke it.")
    sweep_wakes = models.PositiveIntegerField(default=0, help_text="Sweep wakes since its last activity.")
    sweep_after = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Epoch ms on the database clock before which no sweep wakes it again.",
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        help_text="The run whose ctx.workflow() started this one.",
    )
    # Unique, so two starts racing with one key insert one row (NULLs never clash).
    idempotency_key = ExactCharField(max_length=255, null=True, blank=True, unique=True)
    deadline_at = models.BigIntegerField(
        null=True, blank=True, help_text="Epoch ms on the database clock after which the run times out."
    )
    forked_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="forks",
        help_text="The run that fork_workflow() copied this one from.",
    )
    # A run started by ctx.map() or ctx.workflows(): the parent's step, and its
    # place among that step's items (unique together, so each starts once).
    parent_step = models.ForeignKey(
        "WorkflowStep",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="fanned_out",
        # No index of its own: the unique (parent_step, parent_index) constraint leads with it.
        db_index=False,
        help_text="The ctx.map() or ctx.workflows() step of the parent that started this run.",
    )
    parent_index = models.PositiveIntegerField(
        null=True, blank=True, help_text="The place of this run's item among its parent step's items."
    )
    # Safe deploys (docs/safe-deploys.md): the code a run was started under and
    # last driven under (PIKKU_CODE_VERSION, or a hash of its workflow's source).
    # A database default too: rows inserted by raw SQL leave them out.
    code_version = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text="The code version the run was started under.",
    )
    driven_version = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text="The code version of the last pass that drove it.",
    )
    # Read with the run, so a pass of a run that holds no patch marker reads none.
    has_patches = models.BooleanField(
        default=False, db_default=False, help_text="Holds a patch marker (a WorkflowPatch row)."
    )

    # Written only with the otel extra: the start's span, for the spans of its passes.
    trace_context = models.JSONField(
        null=True, blank=True, help_text="The W3C trace context of the span that started it (OpenTelemetry)."
    )
    # Flow control (docs/flow-control.md): the tenant or entity the run
    # belongs to (per-key concurrency), and its deduplication key.
    key = ExactCharField(
        max_length=255, null=True, blank=True, help_text="The tenant or entity this run belongs to."
    )
    rate_at = models.BigIntegerField(
        null=True, blank=True, help_text="Epoch ms on the database clock when its queue's rate let it start."
    )
    debounce_until = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="A debounced run: epoch ms on the database clock past which no start delays it.",
    )
    dedup_key = ExactCharField(
        max_length=255, null=True, blank=True, help_text="At most one unfinished run per workflow has it."
    )
    # ``dedup_key`` while the run is unfinished, NULL once it ends: unique with
    # the workflow, so two unfinished runs never share a dedup key (NULLs
    # never clash), on every database alike (MySQL/MariaDB have no partial
    # index; a stored generated column serves all three).
    dedup_active = models.GeneratedField(
        expression=Case(
            When(status__in=UNFINISHED_STATUSES, then=F("dedup_key")),
            default=Value(None),
            output_field=ExactCharField(max_length=255, null=True),
        ),
        output_field=ExactCharField(max_length=255, null=True),
        db_persist=True,
    )

    objects = WorkflowRunManager()

    class Meta:
        db_table = "pikku_workflow_run"
        ordering = ["-created_at"]
        indexes = [
            # The worker's "what is due" query.
            models.Index(fields=["status", "wake_at"], name="pikku_run_status_wake_idx"),
            # The worker's "what is due next": highest priority first, then the
            # earliest wake_at; the index serves both the wake_at bound and the order.
            models.Index(fields=["status", "-priority", "wake_at"], name="pikku_run_due_idx"),
            # The sweep's stalled query: running runs, oldest activity first.
            models.Index(fields=["status", "updated_at"], name="pikku_run_status_upd_idx"),
            # The admin's newest-first list and its workflow filter.
            models.Index(fields=["created_at"], name="pikku_run_created_idx"),
            models.Index(fields=["workflow"], name="pikku_run_workflow_idx"),
            # The sweep's "past its deadline" query.
            models.Index(fields=["status", "deadline_at"], name="pikku_run_status_deadline_idx"),
            # The admin's code-version filter.
            models.Index(fields=["code_version"], name="pikku_run_code_version_idx"),
            # A debounced start's "the open run of this key", and a key's runs.
            models.Index(fields=["key", "workflow", "status"], name="pikku_run_key_idx"),
            # The retention prune's "the children of these runs" and a cascade's
            # delete: only the runs with a parent, so the planner's statistics
            # (SQLite's after ANALYZE) count the few children a run has, not
            # every run without a parent under one key.
            PartialIndex(
                fields=["parent", "status"], name="pikku_run_child_idx", where=Q(parent__isnull=False)
            ),
        ]
        constraints = [
            # Also the index of a fan-out's "release the next item" and "its items in order".
            models.UniqueConstraint(
                fields=["parent_step", "parent_index"], name="pikku_run_fanout_item_uniq"
            ),
            # One unfinished run per (workflow, dedup_key): racing starts insert one.
            models.UniqueConstraint(fields=["workflow", "dedup_active"], name="pikku_run_dedup_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.display_name} {self.pk} ({self.status})"

    @property
    def display_name(self) -> str:
        """The workflow's name, or for a Django task's run the task's own dotted path."""
        if self.workflow == TASK_WORKFLOW and isinstance(self.input, dict) and self.input.get("task"):
            return str(self.input["task"])
        return self.workflow

    @property
    def lease_key(self) -> str:
        """The key of the lease a worker holds while it drives this run."""
        return f"workflow-run:{self.pk}"

    @property
    def is_finished(self) -> bool:
        return self.status in {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}

    @property
    def deadline(self) -> datetime.datetime | None:
        """``deadline_at`` as an aware UTC datetime, or None."""
        if self.deadline_at is None:
            return None
        return datetime.datetime.fromtimestamp(self.deadline_at / 1000, tz=datetime.timezone.utc)


class WorkflowStep(models.Model):
    """
    One named step of a run. While ``running`` it is held under a lease
    (``lease_expires_at``, epoch ms on the database clock) by the worker of
    attempt ``attempt``; a NULL lease parks it (on a child run).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the unique (run, step_name) constraint leads with it.
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_name = models.CharField(max_length=255)
    rpc_name = models.CharField(max_length=255)
    data = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    retries = models.PositiveIntegerField(help_text="Attempts after the first.")
    retry_delay = models.PositiveIntegerField(null=True, blank=True, help_text="Milliseconds.")
    attempt = models.PositiveIntegerField(default=1)
    # A database default too: the raw step inserts (sql.attempts) leave it out.
    budget_base = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Attempts spent before the current budget of retries + 1 (a retry_workflow() raises it).",
    )
    # The worker-loss budget of a Django task's step (see ``is_exhausted``);
    # NULL for a workflow step, whose lost workers spend its attempts.
    worker_losses = models.PositiveIntegerField(
        null=True, blank=True, help_text="Lost workers it outlives without spending its retries."
    )
    losses = models.PositiveIntegerField(
        default=0, db_default=0, help_text="Lost workers in the current budget (counted by the claim)."
    )
    # True while the current attempt is one a worker's take claimed (a run
    # taken ahead, its outcome maybe held unwritten): lost with its worker, it
    # is given back with no budget spent, and the pass that runs it next
    # claims it itself (not provisional), so a lost worker then spends it.
    provisional = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Claimed by a worker's take, maybe never started: a lost worker spends no budget.",
    )
    lease_expires_at = models.BigIntegerField(
        null=True, blank=True, help_text="Epoch ms on the database clock; NULL when not held."
    )
    child_run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="parent_steps"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = WorkflowStepManager()

    class Meta:
        db_table = "pikku_workflow_step"
        ordering = ["created_at"]
        constraints = [
            # Also the index of the claim, and of the stalled query's per-run
            # "any step in flight / touched lately?" probes (a run has few steps).
            models.UniqueConstraint(fields=["run", "step_name"], name="pikku_step_run_name_uniq"),
        ]
        indexes = [
            # The sweep's "running under a lapsed lease" query.
            models.Index(fields=["status", "lease_expires_at"], name="pikku_step_status_lease_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step_name} of {self.run_id} ({self.status}, attempt {self.attempt})"

    @property
    def attempts_allowed(self) -> int:
        """The highest attempt number the current budget allows."""
        return self.budget_base + self.retries + 1

    @property
    def is_exhausted(self) -> bool:
        """
        Has this step spent every attempt its current budget allows? With a
        ``worker_losses`` budget (a Django task), only attempts that raised
        count against ``retries``, and a step that lost its worker (still
        ``running``) is judged on its losses alone.
        """
        if self.status == StepStatus.RUNNING and self.provisional:
            # Claimed by a take: a lost worker gives the attempt back.
            return False
        if self.worker_losses is None:
            return self.attempt >= self.attempts_allowed
        if self.status == StepStatus.RUNNING:
            return self.losses >= self.worker_losses
        return self.losses > self.worker_losses or self.attempt >= self.attempts_allowed + self.losses


class WorkflowStepAttempt(models.Model):
    """The history of a step: one row per attempt, as it happened."""

    # No index of its own: the unique (step, attempt) constraint leads with it.
    step = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    attempt = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # A database default too: statements that write history rows without a
    # worker (a finish, a sleep's or a signal's step) leave it empty.
    holder = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text="The worker that claimed this attempt.",
    )
    created_at = models.DateTimeField()
    running_at = models.DateTimeField(null=True, blank=True)
    succeeded_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pikku_workflow_step_attempt"
        ordering = ["step_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["step", "attempt"], name="pikku_attempt_step_num_uniq"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt} of {self.step_id} ({self.status})"


class WorkflowSignal(models.Model):
    """
    A signal sent to a run: kept until a ``ctx.wait_for_signal(name)`` of the
    run consumes it. ``consumed_by`` is the wait step that took it (one signal
    per step, one step per signal), so a replay returns the same payload.
    """

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals", db_index=False)
    name = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    sent_at = models.BigIntegerField(help_text="Epoch ms on the database clock.")
    consumed_by = models.OneToOneField(
        WorkflowStep, null=True, blank=True, on_delete=models.SET_NULL, related_name="signal"
    )
    consumed_at = models.BigIntegerField(null=True, blank=True, help_text="Epoch ms on the database clock.")
    # Unique per run, so a sender that retries with its key stores one signal.
    idempotency_key = ExactCharField(max_length=255, null=True, blank=True)

    objects = WorkflowSignalManager()

    class Meta:
        db_table = "pikku_workflow_signal"
        ordering = ["sent_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "idempotency_key"], name="pikku_signal_run_key_uniq"),
        ]
        indexes = [
            # A wait's "oldest unconsumed signal of this name" probe; also the run FK's index.
            models.Index(fields=["run", "name", "sent_at"], name="pikku_signal_run_name_idx"),
        ]

    def __str__(self) -> str:
        return f"signal {self.name!r} to {self.run_id}"


# Schedules and their ledger live in a module of their own; they are models of this app.
# A fan-out's counts (ctx.map, ctx.workflows), likewise.
