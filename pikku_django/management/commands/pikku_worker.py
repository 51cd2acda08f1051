"""``manage.py pikku_worker``: drive workflow runs until stopped."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError
from django.utils import autoreload

from pikku_django.errors import (
    DatabaseMissingError,
    DatabaseNotMigratedError,
    DatabaseUnavailableError,
    WorkerAbortedError,
    WorkerNameTakenError,
)
from pikku_django.management.arguments import holder_name, interval, positive_int, queue_names
from pikku_django.management.logs import configure_logging
from pikku_django.management.startup import wait_for_database
from pikku_django.worker import Worker

RELOAD_HELP = (
    "Restart the worker when the project's Python code changes, as runserver does (development "
    "only: a restart abandons the steps in hand, which run again as new attempts)."
)


class Command(BaseCommand):
    # The settings' checks, not the model checks: those may open a database
    # connection (Django 6 probes SQLite's JSON support), and a worker started
    # while the database is out of reach waits for it instead of failing at once.
    requires_system_checks = [Tags.compatibility]
    help = (
        "Drive workflow runs that are due on several lanes, sweep and fire schedules, until "
        "stopped. SIGTERM or SIGINT finishes the steps in hand and exits 0; a second signal "
        "aborts (exit 1)."
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
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=4,
            help="Lanes: runs driven at once by this process, each on its own thread and "
            "database connection (default: %(default)r).",
        )
        parser.add_argument(
            "--sweep-interval",
            type=interval,
            default=5.0,
            metavar="SECONDS",
            help="Seconds between this process's sweeps (default: %(default)r).",
        )
        parser.add_argument(
            "--no-sweep", action="store_true", help="Don't sweep in this process (run pikku_sweep apart)."
        )
        parser.add_argument(
            "--no-schedules", action="store_true", help="Don't fire schedules in this process."
        )
        parser.add_argument("--database", default=None, help="Database alias (default: routers decide).")
        parser.add_argument("--reload", action="store_true", help=RELOAD_HELP)

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
        concurrency: int,
        sweep_interval: float,
        no_sweep: bool,
        no_schedules: bool,
        reload: bool = False,
        **options: Any,
    ) -> None:
        configure_logging(self.stderr, verbosity)
        worker_options: dict[str, Any] = {
            "holder": holder,
            "interval": interval,
            "batch": batch,
            "once": once,
            "max_runs": max_runs,
            "using": database,
            "queues": None if queues is None else [name for names in queues for name in names],
            "concurrency": concurrency,
            "sweep_interval": None if no_sweep else sweep_interval,
            "schedules": not no_schedules,
        }
        if reload:
            # Django's runserver reloader: the worker runs in a thread of a
            # child process that exits, and is started anew, on a change.
            autoreload.run_with_reloader(self.work, worker_options, verbosity)
            return
        self.work(worker_options, verbosity)

    def work(self, worker_options: dict[str, Any], verbosity: int) -> None:
        """Wait for the database, then drive runs until stopped."""
        worker = Worker(**worker_options)
        if threading.current_thread() is threading.main_thread():
            # Under --reload the reloader owns the signals (SIGTERM exits at once).
            worker.install_signal_handlers()
        try:
            if not wait_for_database(worker.using, stopping=worker.stopping, once=worker.once):
                return
        except (DatabaseMissingError, DatabaseNotMigratedError, DatabaseUnavailableError) as error:
            raise CommandError(str(error), returncode=1) from None
        if verbosity:
            self.stdout.write(f"pikku_worker {worker.holder} ready", ending="\n")
            self.stdout.flush()
        try:
            passes = worker.run()
        except WorkerAbortedError:
            raise CommandError("Aborted by a second signal.", returncode=1) from None
        except (WorkerNameTakenError, DatabaseNotMigratedError, DatabaseUnavailableError) as error:
            raise CommandError(str(error), returncode=1) from None
        if verbosity:
            self.stdout.write(f"pikku_worker {worker.holder} stopped after {passes} passes")
