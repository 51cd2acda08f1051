"""
Schedules and their ledger (re-exported by ``pikku_django.models``): one
``WorkflowSchedule`` row per ``PIKKU_SCHEDULES`` entry, synced from the
setting, and one ``WorkflowScheduleTick`` per tick it recorded.
"""

from __future__ import annotations

import datetime
import time

from django.db import models
from django.utils.timezone import now as django_now

from pikku_django.managers.schedules import WorkflowScheduleManager, WorkflowScheduleTickManager
from pikku_django.models.fields import ExactCharField
from pikku_django.models.runs import WorkflowRun

#: Schedule names are at most this long, so ``schedule:<name>:<tick_at>`` fits an idempotency key.
MAX_SCHEDULE_NAME_LENGTH = 200


def _process_now_ms() -> int:
    """A fallback for rows made by hand: the sync and the scheduler write the database clock's now."""
    return int(time.time() * 1000)


class CatchUp(models.TextChoices):
    LATEST = "latest"
    ALL = "all"
    NONE = "none"


class Overlap(models.TextChoices):
    ALLOW = "allow"
    SKIP = "skip"


class Skipped(models.TextChoices):
    NO = "", "started"
    CATCH_UP = "catch_up", "catch-up"
    OVERLAP = "overlap", "overlap"


class WorkflowSchedule(models.Model):
    """
    A schedule, as synced from ``PIKKU_SCHEDULES``: its target (a workflow or
    a Django Task), when it ticks, and its policies. An entry removed from
    the setting is disabled, its ledger kept.
    """

    name = ExactCharField(max_length=MAX_SCHEDULE_NAME_LENGTH, unique=True)
    workflow = models.CharField(max_length=255, blank=True, default="")
    task = models.CharField(max_length=255, blank=True, default="", help_text="Dotted path of a Django Task.")
    cron = models.CharField(max_length=255)
    timezone = models.CharField(max_length=64, default="UTC")
    input = models.JSONField(null=True, blank=True, help_text="The workflow's input, or the task's kwargs.")
    queue = models.CharField(max_length=100, blank=True, default="")
    priority = models.IntegerField(null=True, blank=True)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    catch_up_window_ms = models.BigIntegerField(default=86_400_000)
    overlap = models.CharField(max_length=8, choices=Overlap.choices, default=Overlap.ALLOW)
    paused = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    start_after = models.BigIntegerField(
        default=_process_now_ms,
        help_text="Epoch ms on the database clock when the schedule was first synced: "
        "until it records a tick, its first tick is the first after this.",
    )
    resumed_at = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Epoch ms on the database clock of its last resume, return to the setting, or change "
        "of cron or time zone: no tick at or before it runs.",
    )
    setting_seen_at = models.BigIntegerField(
        default=0,
        help_text="When the newest setting that names (or disabled) it was first synced (epoch ms, "
        "database clock): an older setting never writes over it, and only the newest setting's "
        "schedules tick.",
    )
    created_at = models.DateTimeField(default=django_now)
    updated_at = models.DateTimeField(default=django_now)

    objects = WorkflowScheduleManager()

    class Meta:
        db_table = "pikku_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)

    def ticks_after(self, last_tick_at: int | None) -> int:
        """
        The instant after which its ticks are due (epoch ms), given its newest
        recorded cron tick: that tick, or its first sync before any, and never
        before its last resume.
        """
        after = self.start_after if last_tick_at is None else last_tick_at
        return after if self.resumed_at is None else max(after, self.resumed_at)

    @property
    def target(self) -> str:
        """What a tick starts: ``workflow NAME`` or ``task PATH``."""
        return f"workflow {self.workflow}" if self.workflow else f"task {self.task}"


class WorkflowScheduleSetting(models.Model):
    """
    Each ``PIKKU_SCHEDULES`` a process synced, by fingerprint, with when it
    was first seen on the database clock: during a rolling deploy a process
    on an older setting (first seen earlier) never writes it back over a newer one.
    """

    fingerprint = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the valid entries.")
    first_seen_at = models.BigIntegerField(help_text="Epoch ms on the database clock.")

    class Meta:
        db_table = "pikku_schedule_setting"

    def __str__(self) -> str:
        return f"setting {self.fingerprint[:12]} first seen at {self.first_seen_at}"


class WorkflowScheduleTick(models.Model):
    """
    The ledger: one row per tick a schedule recorded, unique per (schedule,
    ``tick_at``), written in the transaction that starts its run (or enqueues
    its task). A tick at or before a schedule's newest recorded tick never
    runs again, so the newest row per schedule is the one the guarantee needs.
    """

    # No index of its own: the unique (schedule, tick_at) constraint leads with it.
    schedule = models.ForeignKey(
        WorkflowSchedule, on_delete=models.CASCADE, related_name="ticks", db_index=False
    )
    tick_at = models.BigIntegerField(help_text="The tick's instant, epoch ms.")
    run = models.ForeignKey(
        WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="schedule_ticks"
    )
    task_result_id = models.CharField(
        max_length=255, blank=True, default="", help_text="The enqueued task's result id."
    )
    skipped = models.CharField(max_length=16, choices=Skipped.choices, blank=True, default=Skipped.NO)
    manual = models.BooleanField(default=False, help_text="Triggered by hand, not by the cron.")
    created_at = models.DateTimeField(default=django_now)

    objects = WorkflowScheduleTickManager()

    class Meta:
        db_table = "pikku_schedule_tick"
        ordering = ["-tick_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "tick_at"], name="pikku_tick_schedule_at_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} tick at {self.scheduled_at.isoformat()}"

    @property
    def scheduled_at(self) -> datetime.datetime:
        """``tick_at`` as an aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.tick_at / 1000, tz=datetime.timezone.utc)
