"""``manage.py pikku_worker``: drive workflow runs until stopped."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pikku_django.management.arguments import holder_name, interval, positive_int, queue_names
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
            help="Due runs taken per look (default: %(default)r).",
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
        parser.add_argument(
            "--queue",
            dest="queues",
            type=queue_names,
            action="append",
            default=None,
            metavar="NAME",
            help="Drive only runs of this queue; repeat it or separate names with commas "
            "(default: every queue).",
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
        queues: list[list[str]] | None,
        **options: Any,
    ) -> None:
        self._configure_logging(verbosity)
        worker = Worker(
            holder=holder,
            interval=interval,
            batch=batch,
            once=once,
            max_runs=max_runs,
            using=database,
            queues=None if queues is None else [name for names in queues for name in names],
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

    def _configure_logging(self, verbosity: int) -> None:
        """Verbosity 0: errors only; 1: warnings; 2: each pass; 3: debug."""
        level = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(verbosity, logging.DEBUG)
        logger = logging.getLogger("pikku_django")
        logger.setLevel(level)
        if not any(getattr(h, "_pikku_worker", False) for h in logger.handlers):
            handler = logging.StreamHandler(self.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            handler._pikku_worker = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
            logger.propagate = False
