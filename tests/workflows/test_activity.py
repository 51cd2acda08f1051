"""What the worker's lines say: an error's last line, and the hint for a workflow this process lacks."""

from __future__ import annotations

from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun
from pikku_django.workflows import run_workflow
from pikku_django.workflows.activity import last_line


def test_last_line_of_an_exception_and_of_a_stored_error() -> None:
    assert last_line(RuntimeError("first\nsecond\n")) == "RuntimeError: second"
    assert last_line(KeyError()) == "KeyError"
    stored = {"type": "shop.errors.PaymentError", "message": "card declined", "traceback": "..."}
    assert last_line(stored) == "PaymentError: card declined"
    assert last_line(None) == "Error"


class UnknownWorkflowTests(TransactionTestCase):
    def test_a_run_of_an_unknown_workflow_says_to_restart_the_worker(self) -> None:
        run = WorkflowRun.objects.create_run("test.added_after_this_worker_started")
        with self.assertLogs("pikku_django.workflows.runner", "ERROR") as logs:
            run_workflow(run.pk)
        (line,) = logs.output
        assert str(run.pk) in line and "restart the worker" in line, line
