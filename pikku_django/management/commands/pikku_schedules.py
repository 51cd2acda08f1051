"""``manage.py pikku_schedules``: list the schedules, or trigger, pause or resume one by name."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pikku_django import schedules
from pikku_django.errors import ScheduleNotFoundError
from pikku_django.models import WorkflowSchedule
from pikku_django.schedules.report import describe


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
                self._trigger(trigger, database, verbosity=verbosity, as_json=json)
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
        self._list(database, verbosity=verbosity, as_json=json)

    def _trigger(self, name: str, database: str | None, *, verbosity: int, as_json: bool) -> None:
        """Record a manual tick of the schedule ``name`` now, and report the run or task it started."""
        row = schedules.trigger(name, using=database)
        run = None if row.run_id is None else str(row.run_id)
        if as_json:
            self.stdout.write(
                _dumps(
                    {
                        "schedule": name,
                        "tick_at": row.scheduled_at.isoformat(),
                        "run": run,
                        "task_result_id": row.task_result_id or None,
                    }
                )
            )
        elif verbosity:
            started = f"run {run}" if run else f"task {row.task_result_id}"
            self.stdout.write(
                f"Triggered {name}: a manual tick at {row.scheduled_at.isoformat()}, {started}."
            )

    def _list(self, database: str | None, *, verbosity: int, as_json: bool) -> None:
        """List the schedules, each with its next ticks and its last one."""
        listed = [
            describe(schedule)
            for schedule in WorkflowSchedule.objects.db_manager(database).get_queryset().with_latest()
        ]
        if as_json:
            self.stdout.write(_dumps(listed))
            return
        if not listed:
            if verbosity:
                self.stdout.write("No schedules: PIKKU_SCHEDULES is empty.")
            return
        for entry in listed:
            upcoming = ", ".join(entry["next_ticks"]) or "-"
            self.stdout.write(
                f"{entry['name']}: {entry['target']}, {entry['cron']!r} in {entry['timezone']}, "
                f"{entry['state']}; next {upcoming}; last {_last_tick_text(entry['last_tick'])}"
            )


def _last_tick_text(last: dict[str, Any] | None) -> str:
    """A schedule's last tick as the listing shows it: when, whether manual, and what came of it."""
    if last is None:
        return "never"
    outcome = (
        f"skipped ({last['skipped']})"
        if last["skipped"]
        else (f"run {last['run_status'] or 'pruned'}" if last["task_result_id"] is None else "task enqueued")
    )
    return f"{last['at']}{' manual' if last['manual'] else ''}, {outcome}"


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
