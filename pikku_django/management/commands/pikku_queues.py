"""``manage.py pikku_queues``: list the queues with their figures, or pause or resume one by name."""

from __future__ import annotations

import argparse
import json as json_module
from typing import Any

from django.core.management.base import BaseCommand

from pikku_django import validate
from pikku_django.conf import conf
from pikku_django.errors import InvalidArgumentError
from pikku_django.managers.base import write_alias
from pikku_django.managers.queues import QUEUE_STATUSES, slots_in_use
from pikku_django.models import WorkflowQueue
from pikku_django.store.queues import set_paused, sync_queues


def _queue_name(value: str) -> str:
    try:
        return validate.queue_name("NAME", value)
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Command(BaseCommand):
    help = (
        "List the queues (every queue that has runs or is in PIKKU_QUEUES) with their runs by status, "
        "due backlog, oldest due run's age on the database clock and slots in use; or pause or resume one."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_mutually_exclusive_group()
        actions.add_argument(
            "--pause",
            metavar="NAME",
            type=_queue_name,
            help="Pause the queue: no pass of its runs starts once the pause commits; passes in hand finish.",
        )
        actions.add_argument("--resume", metavar="NAME", type=_queue_name, help="Resume the queue.")
        parser.add_argument("--json", action="store_true", help="Print JSON (one object per queue).")
        parser.add_argument("--database", default=None, help="Database alias (default: the router's).")

    def handle(
        self,
        *,
        verbosity: int,
        pause: str | None,
        resume: str | None,
        json: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        alias = write_alias(WorkflowQueue, database)
        for name, paused, done, already in (
            (pause, True, "Paused", "was paused already"),
            (resume, False, "Resumed", "was not paused"),
        ):
            if name is not None:
                changed = set_paused(name, paused, using=alias)
                if verbosity:
                    self.stdout.write(f"{done} {name}." if changed else f"{name} {already}; nothing changed.")
                return
        sync_queues(using=alias)
        rows = self.rows(alias)
        if json:
            self.stdout.write(json_module.dumps(rows, indent=2))
        elif not rows:
            if verbosity:
                self.stdout.write("No queues.")
        else:
            for row in rows:
                self.stdout.write(self.line(row))

    @staticmethod
    def rows(alias: str) -> list[dict[str, Any]]:
        """Every queue's figures, as the ``--json`` output lists them."""
        used = slots_in_use(alias)
        rows = []
        for queue in WorkflowQueue.objects.using(alias).with_stats():
            oldest = getattr(queue, "oldest_due_at", None)
            rows.append(
                {
                    "name": queue.name,
                    "paused": queue.paused,
                    "runs": {status: int(getattr(queue, f"runs_{status}")) for status in QUEUE_STATUSES},
                    "due": int(getattr(queue, "due", 0)),
                    "oldest_due_ms": None if oldest is None else max(0, int(queue.db_now_ms) - int(oldest)),  # type: ignore[attr-defined]
                    "slots_used": used.get(queue.name, 0),
                    "slots_limit": conf.concurrency(queue.name),
                }
            )
        return rows

    @staticmethod
    def line(row: dict[str, Any]) -> str:
        """One queue as a line of text."""
        runs = ", ".join(f"{count} {status}" for status, count in row["runs"].items())
        oldest = "" if row["oldest_due_ms"] is None else f", oldest due {row['oldest_due_ms'] / 1000:.1f} s"
        limit = "unlimited" if row["slots_limit"] is None else row["slots_limit"]
        state = " (paused)" if row["paused"] else ""
        return f"{row['name']}{state}: {runs}; due {row['due']}{oldest}; slots {row['slots_used']}/{limit}"
