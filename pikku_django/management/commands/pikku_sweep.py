"""``manage.py pikku_sweep``: one sweep pass, or a loop of them."""

from __future__ import annotations

import argparse
import json
import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from pikku_django.conf import conf
from pikku_django.errors import DatabaseNotMigratedError
from pikku_django.management.arguments import interval, positive_int, seconds
from pikku_django.management.logs import configure_logging
from pikku_django.outages import is_schema_error
from pikku_django.sweep import SweepReport, sweep
from pikku_django.worker.loops import SweepLoop
from pikku_django.worker.poller import Poller


class Command(BaseCommand):
    help = (
        "Sweep the workflow store: fail steps whose worker vanished on their last attempt, "
        "wake runs that need a worker, prune dead lease rows and finished runs past "
        "PIKKU_RETENTION_MS. Safe to run on many nodes at once."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--stalled-after",
            type=seconds,
            default=None,
            metavar="SECONDS",
            help="Wake running runs idle this long with no step in flight "
            "(default: PIKKU_STALLED_AFTER_MS, %(default)s = the setting).",
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            default=100,
            help="At most this many rows of each kind per pass (default: %(default)r).",
        )
        parser.add_argument(
            "--prune-limit",
            type=positive_int,
            default=1000,
            help="Delete at most this many finished runs past their retention per pass "
            "(default: %(default)r).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would be done; change nothing."
        )
        parser.add_argument(
            "--json", action="store_true", help="Print each pass's report as one JSON object."
        )
        parser.add_argument("--loop", action="store_true", help="Sweep again every --interval until stopped.")
        parser.add_argument(
            "--interval",
            type=interval,
            default=60.0,
            metavar="SECONDS",
            help="Seconds between passes with --loop (default: %(default)r).",
        )
        parser.add_argument("--database", default=None, help="Database alias (default: 'default').")

    def handle(
        self,
        *,
        verbosity: int,
        stalled_after: float | None,
        limit: int,
        prune_limit: int,
        dry_run: bool,
        json: bool,
        loop: bool,
        interval: float,
        database: str | None,
        **options: Any,
    ) -> None:
        stalled_after_ms = conf.STALLED_AFTER_MS if stalled_after is None else round(stalled_after * 1000)
        configure_logging(self.stderr, verbosity)

        def report(sweep_report: SweepReport) -> None:
            if json:
                self.stdout.write(_json_dumps(sweep_report.as_dict()))
            elif verbosity:
                self.stdout.write(sweep_report.summary())

        options = {
            "stalled_after_ms": stalled_after_ms,
            "limit": limit,
            "prune_limit": prune_limit,
            "dry_run": dry_run,
            "using": database,
        }
        try:
            if not loop:
                report(sweep(**options))
                return
            sweeper = SweepLoop(
                name="pikku_sweep --loop", interval=interval, options=options, report=report, prune_every=0
            )
            self._install_signal_handlers(sweeper)
            # A loop outlives a database restart: the poller waits it out.
            sweeper.run()
        except DatabaseError as error:
            if is_schema_error(error):
                raise CommandError(str(DatabaseNotMigratedError(error)), returncode=1) from None
            raise
        except DatabaseNotMigratedError as error:
            raise CommandError(str(error), returncode=1) from None

    def _install_signal_handlers(self, sweeper: Poller) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            sweeper.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)


def _json_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
