"""``manage.py pikku_replay_check``: would the unfinished runs replay on this code?"""

from __future__ import annotations

import argparse
import json as json_module
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import router

from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows.replay_check import PAGE_SIZE, UNFINISHED, Mismatch, replay, unfinished_runs


def statuses(value: str) -> list[str]:
    """A comma-separated list of run statuses."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in RunStatus.values]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give run statuses separated by commas, of {', '.join(RunStatus.values)}"
        )
    return names


class Command(BaseCommand):
    help = (
        "Replay the unfinished runs against the code of this process, without running any step "
        "or writing any row: name each run whose history no longer fits (a WorkflowReplayError "
        "on its next pass) and exit 1 if there is any. Run it in CI against a copy of production "
        "before a deploy."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--status",
            type=statuses,
            default=list(UNFINISHED),
            help="The statuses of the runs to check, comma-separated (default: running,suspended).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON document: a list of {run_id, workflow, step, reason}.",
        )
        parser.add_argument("--database", default=None, help="Database alias (default: the router's).")

    def handle(
        self, *, verbosity: int, status: list[str], json: bool, database: str | None, **options: Any
    ) -> None:
        alias = database or router.db_for_read(WorkflowRun)
        mismatches: list[Mismatch] = []
        checked = 0
        for page in unfinished_runs(alias, status):
            for run, steps, markers in page:
                mismatch = replay(run, steps, markers)
                if mismatch is not None:
                    mismatches.append(mismatch)
                    if not json and verbosity:
                        where = f"run {mismatch.run_id} ({mismatch.workflow}) step {mismatch.step!r}"
                        self.stdout.write(f"{where}: {mismatch.reason}")
            checked += len(page)
            if verbosity and not json and len(page) == PAGE_SIZE:
                # A progress line on a long check (a full page: more may follow).
                self.stderr.write(f"checked {checked} runs so far...")
        if json:
            self.stdout.write(json_module.dumps([m.as_dict() for m in mismatches], indent=1))
        elif verbosity:
            self.stdout.write(f"{checked} runs checked, {len(mismatches)} would not replay.")
        if mismatches:
            raise CommandError(
                f"{len(mismatches)} of {checked} runs would not replay on this code.", returncode=1
            )
