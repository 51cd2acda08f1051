"""The store of schedules and their ledger: pause, resume, the row lock of a pass, the last tick."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.db.models import F, OuterRef, Subquery

from pikku_django import models as pikku_models
from pikku_django.clock import DbNow, DbNowMs

if TYPE_CHECKING:
    from pikku_django.models.schedules import WorkflowSchedule, WorkflowScheduleTick  # noqa: F401


class WorkflowScheduleQuerySet(models.QuerySet["WorkflowSchedule"]):
    def enabled(self) -> WorkflowScheduleQuerySet:
        return self.filter(enabled=True)

    def active(self) -> WorkflowScheduleQuerySet:
        """Enabled and not paused: the schedules that tick."""
        return self.filter(enabled=True, paused=False)

    def with_last_tick(self) -> WorkflowScheduleQuerySet:
        """
        Each schedule with ``last_tick_at``, its newest recorded tick that the
        cron made (manual ticks aside), and ``db_now_ms``: one statement, an
        index probe per schedule on the ledger's unique (schedule, tick_at).
        """

        ledger = pikku_models.WorkflowScheduleTick.objects.filter(schedule=OuterRef("pk"), manual=False)
        newest = ledger.order_by("-tick_at").values("tick_at")[:1]
        return self.annotate(last_tick_at=Subquery(newest), db_now_ms=DbNowMs())

    def with_latest(self) -> WorkflowScheduleQuerySet:
        """
        ``with_last_tick()``, and the newest ledger row of each schedule
        (manual or not): ``latest_tick_at``, ``latest_skipped``, ``latest_manual``,
        ``latest_run_id``, ``latest_run_status``, ``latest_task_result_id``.
        """

        newest = pikku_models.WorkflowScheduleTick.objects.filter(schedule=OuterRef("pk")).order_by(
            "-tick_at"
        )[:1]
        columns = {
            "tick_at": "tick_at",
            "skipped": "skipped",
            "manual": "manual",
            "run_id": "run_id",
            "run_status": "run__status",
            "task_result_id": "task_result_id",
        }
        return self.with_last_tick().annotate(
            **{f"latest_{name}": Subquery(newest.values(column)) for name, column in columns.items()}
        )

    def pause(self) -> int:
        """Pause these schedules: their ticks are not recorded until resumed. Returns how many changed."""
        return self.filter(paused=False).update(paused=True, updated_at=DbNow())

    def resume(self) -> int:
        """
        Resume these paused schedules; the ticks they missed while paused never
        run (their next tick is the first after now). Returns how many changed.
        """
        return self.filter(paused=True).update(paused=False, resumed_at=DbNowMs(), updated_at=DbNow())

    def hold(self, pk: Any, *, wait: bool = False) -> bool:
        """
        Hold the schedule's row until the transaction ends, so one pass at a
        time records its ticks; False when another pass holds it (unless
        ``wait``) or there is no such row. Inside ``transaction.atomic()``.
        On PostgreSQL and MySQL/MariaDB a row lock, skipping a held row; on
        SQLite (no row locks) a write to the row, which takes the database's
        write lock at once, so the reads after it see every committed tick.
        """
        connection = connections[self.db]
        rows = self.filter(pk=pk)
        if connection.features.has_select_for_update:
            skip = not wait and connection.features.has_select_for_update_skip_locked
            return rows.select_for_update(skip_locked=skip).values_list("pk", flat=True).first() is not None
        return rows.update(updated_at=F("updated_at")) == 1


class WorkflowScheduleManager(models.Manager["WorkflowSchedule"]):
    """The store of schedules."""

    def get_queryset(self) -> WorkflowScheduleQuerySet:
        return WorkflowScheduleQuerySet(self.model, using=self._db)

    def active(self) -> WorkflowScheduleQuerySet:
        return self.get_queryset().active()

    def with_last_tick(self) -> WorkflowScheduleQuerySet:
        return self.get_queryset().with_last_tick()


class WorkflowScheduleTickQuerySet(models.QuerySet["WorkflowScheduleTick"]):
    def started(self) -> WorkflowScheduleTickQuerySet:
        """Ticks that started their run or enqueued their task."""
        return self.filter(skipped="")

    def skipped(self) -> WorkflowScheduleTickQuerySet:
        return self.exclude(skipped="")


class WorkflowScheduleTickManager(models.Manager["WorkflowScheduleTick"]):
    """The ledger."""

    def get_queryset(self) -> WorkflowScheduleTickQuerySet:
        return WorkflowScheduleTickQuerySet(self.model, using=self._db)

    def scheduled_at(self, run_id: Any) -> datetime.datetime | None:
        """The instant of the tick that started the run ``run_id`` (aware UTC), or None if no schedule did."""
        at = self.filter(run_id=run_id).values_list("tick_at", flat=True).first()
        return None if at is None else datetime.datetime.fromtimestamp(at / 1000, tz=datetime.timezone.utc)
