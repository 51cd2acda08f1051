"""``manage.py pikku_worker``: drive workflow runs until stopped."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pikku_django.management.arguments import holder_name, interval, positive_int
from pikku_django.management.logs import configure_logging
from pikku_django.worker import Worker


class Command(BaseCommand):
    help = (
        "Drive workflow runs that are due, until stopped. SIGTERM or SIGINT finishes "
        "the step in hand and exits 0; a second signal aborts (exit 1)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", help="Drive what is due now, then exit.")
        parser.add_argument(
            "--interval",
            type=interval,
            default=1.0,
            help="Seconds to wait when nothing is due (default: %(default)r).",
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            default=10,
            help="Due runs looked at per query, and passes per look; the due query runs again "
            "before every pass, so a recovered run goes first (default: %(default)r).",
        )
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            default=None,
            help="Exit after this many passes (default: no limit).",
        )
        parser.add_argument(
            "--holder",
            type=holder_name,
            default=None,
            help="This worker's name in leases (default: host:pid:random).",
        )
        parser.add_argument("--database", default=None, help="Database alias (default: routers decide).")

    def handle(
        self,
        *,
        verbosity: int,
        once: bool,
        interval: float,
        batch: int,
        max_runs: int | None,
        holder: str | None,
        database: str | None,
        **options: Any,
    ) -> None:
        configure_logging(self.stderr, verbosity)
        worker = Worker(
            holder=holder, interval=interval, batch=batch, once=once, max_runs=max_runs, using=database
        )
        worker.install_signal_handlers()
        if verbosity:
            self.stdout.write(f"pikku_worker {worker.holder} ready", ending="\n")
            self.stdout.flush()
        try:
            passes = worker.run()
        except KeyboardInterrupt:
            raise CommandError("Aborted by a second signal.", returncode=1) from None
        if verbosity:
            self.stdout.write(f"pikku_worker {worker.holder} stopped after {passes} passes")
