"""Every write, and every read that decides one, goes to the router's write database."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connections
from django.test import TransactionTestCase, override_settings
from django.urls import reverse

from pikku_django import schedules
from pikku_django.leases import hold_lease
from pikku_django.models import WorkflowRun, WorkflowSchedule
from pikku_django.sweep import sweep
from pikku_django.worker import Worker
from pikku_django.workflows import (
    cancel_workflow,
    fork_workflow,
    retry_workflow,
    run_workflow,
    send_signal,
    start_workflow,
)


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


#: The read alias of ``ToReadOnlyReplica``: the test database again, opened read-only.
REPLICA = "read-only-replica"


def read_only_settings(primary: dict[str, Any]) -> dict[str, Any]:
    """
    ``primary``'s connection settings, opened read-only: on PostgreSQL every
    transaction of the session read-only, on MariaDB/MySQL the session's
    transactions, on SQLite the same file opened with ``mode=ro``.
    """
    replica = copy.deepcopy(primary)
    options = replica.setdefault("OPTIONS", {})
    engine = replica["ENGINE"]
    if engine.endswith("postgresql"):
        options["options"] = f"{options.get('options', '')} -c default_transaction_read_only=on".strip()
    elif engine.endswith("mysql"):
        options["init_command"] = "SET SESSION TRANSACTION READ ONLY"
    elif engine.endswith("sqlite3"):
        # Django's SQLite backend opens every NAME as a URI.
        replica["NAME"] = f"file:{replica['NAME']}?mode=ro"
    else:
        raise AssertionError(f"no read-only replica for the {engine!r} backend")
    replica["TEST"] = {"MIRROR": "default"}
    return replica


class ToReadOnlyReplica:
    """A primary/replica router: every read goes to the read-only replica, every write to "default"."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return REPLICA

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, *objs: Any, **hints: Any) -> bool:
        return True


@override_settings(DATABASE_ROUTERS=[f"{__name__}.ToReadOnlyReplica"])
class ReadOnlyReplicaTests(TransactionTestCase):
    """
    The replica genuinely refuses writes, so every entry point and admin
    action that succeeds here sent no write to the read database.
    """

    databases = {"default", REPLICA}

    @classmethod
    def setUpClass(cls) -> None:
        # An alias made now, on the test database set up for "default"; a
        # mirror, so the test case never flushes it.
        connections.settings[REPLICA] = read_only_settings(connections["default"].settings_dict)
        cls.addClassCleanup(cls.drop_replica)
        super().setUpClass()

    @classmethod
    def drop_replica(cls) -> None:
        connections[REPLICA].close()
        del connections[REPLICA]
        del connections.settings[REPLICA]

    def test_the_replica_refuses_writes(self) -> None:
        with pytest.raises(DatabaseError):
            User.objects.db_manager(REPLICA).create_user("not-on-a-replica")

    def test_the_entry_points_write_on_the_primary(self) -> None:
        run = start_workflow("test.signals")
        assert WorkflowRun.objects.using(REPLICA).filter(pk=run.pk).exists()
        passed = run_workflow(run.pk)
        assert passed.status == "suspended", passed.error["traceback"]
        send_signal(run.pk, "go", {"n": 1})
        assert Worker(holder="replica", once=True).run() == 1
        done = WorkflowRun.objects.get(pk=run.pk)
        assert done.status == "completed", done.error["traceback"]
        other = start_workflow("test.steps", {"steps": 1}, idempotency_key="replica-1")
        assert start_workflow("test.steps", {"steps": 1}, idempotency_key="replica-1").pk == other.pk
        assert cancel_workflow(other.pk) is True
        assert retry_workflow(other.pk) is True
        assert fork_workflow(done.pk).status == "running"
        with hold_lease("replica:lease") as held:
            assert held.token >= 1
        sweep()
        inline = start_workflow("test.double", 21, inline=True)
        assert (inline.status, inline.output) == ("completed", 42)

    def test_the_admin_actions_write_on_the_primary(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        url = reverse("admin:pikku_django_workflowrun_changelist")
        runs = [start_workflow("test.steps", {"steps": 1}).pk for _ in range(3)]
        assert str(runs[0]) in self.client.get(url).content.decode()
        for action, message in [
            ("wake_runs", "Woke 3 runs."),
            ("cancel_runs", "Cancelled 3 runs."),
            ("retry_runs", "Retried 3 runs."),
        ]:
            response = self.client.post(url, {"action": action, "_selected_action": runs}, follow=True)
            assert message in response.content.decode(), action
        assert set(WorkflowRun.objects.filter(pk__in=runs).values_list("status", flat=True)) == {"running"}

    @override_settings(PIKKU_SCHEDULES={"nightly": {"workflow": "test.scheduled", "cron": "0 2 * * *"}})
    def test_the_schedule_admin_triggers_on_the_primary(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        url = reverse("admin:pikku_django_workflowschedule_changelist")
        schedules.sync()
        assert "nightly" in self.client.get(url).content.decode()
        for action, message in [
            ("trigger_schedules", "Triggered 1 schedule."),
            ("pause_schedules", "Paused 1 schedule."),
            ("resume_schedules", "Resumed 1 schedule."),
        ]:
            posted = {"action": action, "_selected_action": [WorkflowSchedule.objects.get(name="nightly").pk]}
            response = self.client.post(url, posted, follow=True)
            assert message in response.content.decode(), action
