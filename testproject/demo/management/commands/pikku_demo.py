"""``manage.py pikku_demo``: start a few order runs and drive them with worker processes."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from pikku_django.management.arguments import positive_int
from pikku_django.models import WorkflowRun, WorkflowStepAttempt
from pikku_django.workflows import start_workflow

#: The demo's last lines: where to look next.
WHERE_NEXT = """
Where next: see these runs, their steps and attempts in the admin:
  .venv/bin/python manage.py createsuperuser
  .venv/bin/python manage.py runserver
  then open http://127.0.0.1:8000/admin/pikku_django/workflowrun/ and log in.
The demo's workflow is testproject/demo/workflows.py; the README's "Your first
project" puts pikku_django into a project of your own."""


class Command(BaseCommand):
    help = "Start a few demo order runs, drive them with pikku_worker processes, and show what happened."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--runs", type=positive_int, default=4, help="Runs to start (default: %(default)r)."
        )
        parser.add_argument(
            "--workers", type=positive_int, default=2, help="Worker processes (default: %(default)r)."
        )
        parser.add_argument(
            "--timeout",
            type=positive_int,
            default=60,
            help="Seconds to wait for the runs (default: %(default)r).",
        )

    def handle(self, *, runs: int, workers: int, timeout: int, verbosity: int, **options: Any) -> None:
        started = [
            start_workflow("demo.order", {"order_id": 100 + i, "cents": 500 + i}).pk for i in range(runs)
        ]
        self.stdout.write(f"Started {runs} order runs; driving them with {workers} pikku_worker processes.")
        manage = Path(settings.BASE_DIR) / "manage.py"
        procs = [
            subprocess.Popen(  # noqa: S603 (our own interpreter and manage.py)
                [sys.executable, str(manage), "pikku_worker", "--interval", "0.2", "--verbosity", "0"],
                env=dict(os.environ),
            )
            for _ in range(workers)
        ]
        try:
            finished = self._wait(started, timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._report(started)
        if not finished:
            raise CommandError(f"Not every run finished within {timeout} s.")
        failed = WorkflowRun.objects.filter(pk__in=started).exclude(status="completed").count()
        if failed:
            raise CommandError(f"{failed} of {runs} runs did not complete.")
        self.stdout.write(self.style.SUCCESS(f"All {runs} runs completed."))
        self.stdout.write(WHERE_NEXT)

    def _wait(self, started: list[Any], timeout: int) -> bool:
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            done = WorkflowRun.objects.filter(pk__in=started).exclude(status="running").count()
            if done != last:
                self.stdout.write(f"  {done}/{len(started)} runs finished")
                last = done
            if done == len(started):
                return True
            time.sleep(0.2)
        return False

    def _report(self, started: list[Any]) -> None:
        self.stdout.write("")
        self.stdout.write(f"{'run':<10} {'status':<10} {'step':<8} {'status':<10} attempts")
        attempts = WorkflowStepAttempt.objects.filter(step__run__in=started).order_by("attempt")
        by_step: dict[Any, list[str]] = {}
        for attempt in attempts:
            by_step.setdefault(attempt.step_id, []).append(f"{attempt.attempt}:{attempt.status}")
        for run in (
            WorkflowRun.objects.filter(pk__in=started).order_by("created_at").prefetch_related("steps")
        ):
            for i, step in enumerate(run.steps.order_by("created_at")):
                head = f"{str(run.pk)[:8]:<10} {run.status:<10}" if i == 0 else " " * 21
                self.stdout.write(
                    f"{head} {step.step_name:<8} {step.status:<10} {' '.join(by_step.get(step.pk, []))}"
                )
