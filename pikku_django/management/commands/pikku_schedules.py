"""``manage.py pikku_schedules``: list the schedules, or trigger, pause or resume one by name."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pikku_django import schedules
from pikku_django.errors import ScheduleNotFoundError
from pikku_django.models import WorkflowSchedule
from pikku_django.schedule_report import describe


class Command(BaseCommand):
    help = (
        "List the schedules of PIKKU_SCHEDULES with their next ticks on the database clock, "
        "or trigger, pause or resume one by name."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_mutually_exclusive_group()
        actions.add_argument("--trigger", metavar="NAME", help="Record a manual tick now and start its run.")
        actions.add_argument(
            "--pause", metavar="NAME", help="Pause the schedule: its ticks are not recorded."
        )
        actions.add_argument(
            "--resume",
            metavar="NAME",
            help="Resume the schedule; the ticks it missed while paused never run.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print JSON (one object per schedule, or the tick)."
        )
        parser.add_argument("--database", default=None, help="Database alias (default: the router's).")

    def handle(
        self,
        *,
        verbosity: int,
        trigger: str | None,
        pause: str | None,
        resume: str | None,
        json: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        # The rows follow the setting first, so a schedule added a moment ago is listed (and triggerable).
        schedules.sync(using=database)
        try:
            if trigger is not None:
                row = schedules.trigger(trigger, using=database)
                run = None if row.run_id is None else str(row.run_id)
                if json:
                    self.stdout.write(
                        _dumps(
                            {
                                "schedule": trigger,
                                "tick_at": row.scheduled_at.isoformat(),
                                "run": run,
                                "task_result_id": row.task_result_id or None,
                            }
                        )
                    )
                elif verbosity:
                    started = f"run {run}" if run else f"task {row.task_result_id}"
                    self.stdout.write(
                        f"Triggered {trigger}: a manual tick at {row.scheduled_at.isoformat()}, {started}."
                    )
                return
            for name, change, done, already in (
                (pause, schedules.pause, "Paused", "was paused already"),
                (resume, schedules.resume, "Resumed", "was not paused"),
            ):
                if name is not None:
                    changed = change(name, using=database)
                    if verbosity:
                        self.stdout.write(
                            f"{done} {name}." if changed else f"{name} {already}; nothing changed."
                        )
                    return
        except ScheduleNotFoundError as e:
            raise CommandError(str(e)) from None
        listed = [
            describe(schedule)
            for schedule in WorkflowSchedule.objects.db_manager(database).get_queryset().with_latest()
        ]
        if json:
            self.stdout.write(_dumps(listed))
            return
        if not listed:
            if verbosity:
                self.stdout.write("No schedules: PIKKU_SCHEDULES is empty.")
            return
        for entry in listed:
            last = entry["last_tick"]
            if last is None:
                last_text = "never"
            else:
                outcome = (
                    f"skipped ({last['skipped']})"
                    if last["skipped"]
                    else (
                        f"run {last['run_status'] or 'pruned'}"
                        if last["task_result_id"] is None
                        else "task enqueued"
                    )
                )
                last_text = f"{last['at']}{' manual' if last['manual'] else ''}, {outcome}"
            upcoming = ", ".join(entry["next_ticks"]) or "-"
            self.stdout.write(
                f"{entry['name']}: {entry['target']}, {entry['cron']!r} in {entry['timezone']}, "
                f"{entry['state']}; next {upcoming}; last {last_text}"
            )


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
