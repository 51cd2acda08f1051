"""Every write, and every read that decides one, goes to the router's write database."""

from __future__ import annotations

from typing import Any

from django.test import TransactionTestCase, override_settings

from pikku_django.leases import hold_lease
from pikku_django.models import WorkflowRun
from pikku_django.sweep import sweep
from pikku_django.worker import Worker
from pikku_django.workflows import cancel_workflow, run_workflow, send_signal, start_workflow


class ReadsGoNowhere:
    """A primary/replica router whose replica does not exist: a read routed to it fails at once."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica-that-is-not-there"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"


@override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsGoNowhere"])
class WriteRouterTests(TransactionTestCase):
    def test_the_entry_points_read_and_write_on_the_write_database(self) -> None:
        run = start_workflow("test.signals")
        passed = run_workflow(run.pk)
        assert passed.status == "suspended", passed.error["traceback"]
        send_signal(run.pk, "go", {"n": 1})
        assert Worker(holder="routed", once=True).run() == 1
        done = WorkflowRun.objects.using("default").get(pk=run.pk)
        assert done.status == "completed", done.error["traceback"]
        other = start_workflow("test.steps", {"steps": 1}, idempotency_key="routed-1")
        assert start_workflow("test.steps", {"steps": 1}, idempotency_key="routed-1").pk == other.pk
        assert cancel_workflow(other.pk) is True
        with hold_lease("routed:lease") as held:
            assert held.token >= 1
        sweep()
        inline = start_workflow("test.double", 21, inline=True)
        assert (inline.status, inline.output) == ("completed", 42)
