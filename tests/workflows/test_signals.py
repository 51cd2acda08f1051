"""
``pikku_django.signals``: ``run_finished``, ``attempt_failed`` and
``worker_lost``, each sent once what it tells has committed, with the
arguments DESIGN names; with nobody listening a pass makes the same
statements as before.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection
from django.dispatch import Signal
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.signals import attempt_failed, run_finished, worker_lost
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.factories import lapse_step

PLAIN_STEP = "testproject.testing.workflows.plain_step"


@contextmanager
def listening(signal: Signal, sender: type) -> Iterator[list[dict[str, Any]]]:
    """Every send of ``signal`` by ``sender`` while the block runs, with the row as committed then."""
    heard: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        run = kwargs["run"]
        kwargs["committed_status"] = WorkflowRun.objects.get(pk=run.pk).status
        heard.append(kwargs)

    signal.connect(receiver, sender=sender, weak=False)
    try:
        yield heard
    finally:
        signal.disconnect(receiver, sender=sender)


class SignalTests(TransactionTestCase):
    def test_run_finished_is_sent_once_the_outcome_commits(self) -> None:
        with listening(run_finished, WorkflowRun) as heard:
            run = start_workflow("test.steps", {"steps": 1}, inline=True)
            failed = start_workflow("test.fails", inline=True)
        assert [(h["run"].pk, h["run"].status, h["committed_status"]) for h in heard] == [
            (run.pk, "completed", "completed"),
            (failed.pk, "failed", "failed"),
        ]
        assert heard[1]["run"].error["message"] == "the child gave up"

    def test_attempt_failed_names_the_run_step_attempt_and_error(self) -> None:
        missing = str(Path(tempfile.mkdtemp()) / "never")
        with listening(attempt_failed, WorkflowStep) as heard:
            run = start_workflow("test.fragile", {"path": missing}, inline=True)
        assert run.status == "failed"
        assert [(h["run"].pk, h["step"].step_name, h["attempt"]) for h in heard] == [
            (run.pk, "fragile", 1),
            (run.pk, "fragile", 2),
        ]
        assert all(isinstance(h["error"], RuntimeError) and missing in str(h["error"]) for h in heard)

    def test_worker_lost_names_the_lost_holder(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        steps = WorkflowStep.objects
        step = steps.insert_step(run, "s0", PLAIN_STEP, retries=2)
        assert steps.claim(run.pk, "s0", PLAIN_STEP, 60_000, holder="gone-worker") is not None
        lapse_step(step)
        with listening(worker_lost, WorkflowStep) as heard:
            assert run_workflow(run.pk).status == "completed"
        assert [(h["run"].pk, h["step"].step_name, h["holder"]) for h in heard] == [
            (run.pk, "s0", "gone-worker")
        ]

    def test_nobody_listening_costs_no_statement(self) -> None:
        def statements(listen: bool) -> int:
            missing = str(Path(tempfile.mkdtemp()) / "never")
            run = start_workflow("test.fragile", {"path": missing})
            with CaptureQueriesContext(connection) as queries:
                if listen:
                    with listening(attempt_failed, WorkflowStep), listening(run_finished, WorkflowRun):
                        run_workflow(run.pk)
                else:
                    run_workflow(run.pk)
            # The receivers' own reads are theirs.
            return len(queries) - (3 if listen else 0)

        assert not run_finished.has_listeners(WorkflowRun)
        assert not attempt_failed.has_listeners(WorkflowStep)
        assert statements(listen=False) == statements(listen=True)
