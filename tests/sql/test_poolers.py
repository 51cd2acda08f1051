"""
Behind a transaction-mode pooler: a real PgBouncer (Debian's package,
started by the test) in front of the server, where each transaction may get
another server session; and, in process, what such a pooler does to a
session's prepared statements (``DEALLOCATE ALL`` under a live connection).

A project behind such a pooler sets ``DISABLE_SERVER_SIDE_CURSORS``, as
Django asks of it: the hot statements are then never prepared (another
client's session may hold a statement of psycopg's name for another text).
Without it, a statement whose prepared form the pooler lost is run again
unprepared, inside a transaction too, by sending the whole transaction again.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from django.db import connection, connections
from django.test import TransactionTestCase

from pikku_django.managers import FINISHED_RUN_STATUSES
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.sql.conflicts import in_transaction
from pikku_django.sql.cursors import prepares
from pikku_django.workflows import start_workflow
from tests.support.children import poll_until, subprocess_env
from tests.support.pgbouncer import pgbouncer
from tests.support.processes import ProcessTestCase

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL sessions"
)


def prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


class PreparedStatementsBehindPoolerTests(TransactionTestCase):
    def reopen(self, **settings: Any) -> None:
        """The default connection, reopened with ``settings`` (restored after the test)."""
        saved = dict(connection.settings_dict)
        saved_options = dict(saved.get("OPTIONS", {}))

        def restore() -> None:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)
            connection.settings_dict["OPTIONS"] = saved_options

        connection.close()
        self.addCleanup(restore)
        options = settings.pop("OPTIONS", {})
        connection.settings_dict.update(settings)
        connection.settings_dict["OPTIONS"] = {**saved_options, **options}

    def test_a_statement_lost_inside_a_transaction_is_sent_again_unprepared(self) -> None:
        self.reopen()
        assert Lease.objects.acquire("first", "h", 60_000) is not None
        assert prepared()
        # What a transaction-mode pooler does when it hands the client another session.
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        lease = in_transaction("default", lambda: Lease.objects.acquire_within("second", "h", 60_000))
        assert lease is not None and Lease.objects.filter(key="second", holder="h").exists()
        assert connections["default"].connection._pikku_unprepared is True
        Lease.objects.acquire("third", "h", 60_000)
        assert prepared() == []

    def test_disable_server_side_cursors_prepares_nothing(self) -> None:
        self.reopen(DISABLE_SERVER_SIDE_CURSORS=True)
        assert not prepares(connection)
        assert Lease.objects.acquire("first", "h", 60_000) is not None
        assert prepared() == []

    def test_a_number_as_prepare_threshold_prepares_behind_a_pooler_too(self) -> None:
        # PgBouncer 1.21+ with max_prepared_statements keeps them.
        self.reopen(DISABLE_SERVER_SIDE_CURSORS=True, OPTIONS={"prepare_threshold": 5})
        assert prepares(connection)
        Lease.objects.acquire("first", "h", 60_000)
        assert prepared()


#: Every run must have ended well within this (polled, no fixed sleep).
WITHIN_S = 60.0


@pytest.mark.slow
class PgBouncerProcessTests(ProcessTestCase):
    def wait_for_ends(self, runs: list[WorkflowRun]) -> dict[str, int]:
        ids = [run.pk for run in runs]

        def ended() -> bool:
            return (
                not WorkflowRun.objects.filter(pk__in=ids).exclude(status__in=FINISHED_RUN_STATUSES).exists()
            )

        poll_until(ended, timeout=WITHIN_S, interval=0.2)
        statuses: dict[str, int] = {}
        for status in WorkflowRun.objects.filter(pk__in=ids).values_list("status", flat=True):
            statuses[status] = statuses.get(status, 0) + 1
        return statuses

    def start_runs(self, count: int) -> list[WorkflowRun]:
        runs = [start_workflow("test.fan_mix", {"n": 3, "max_parallel": 2}) for _ in range(count)]
        return runs + [start_workflow("test.noop", {"steps": 3}) for _ in range(count)]

    def test_a_worker_behind_pgbouncer_ends_every_run_and_restarts_under_its_name(self) -> None:
        with pgbouncer(pool_size=3) as url:
            env = subprocess_env(DATABASE_URL=url, PIKKU_BEHIND_POOLER="1")
            args = ("--concurrency", "4", "--interval", "0.05", "--sweep-interval", "1")
            runs = self.start_runs(6)
            worker = self.worker("pooled", *args, env=env)
            started = time.monotonic()
            statuses = self.wait_for_ends(runs)
            assert statuses == {"completed": len(runs)}, (
                time.monotonic() - started,
                self.log(worker)[-3000:],
            )
            assert not WorkflowStep.objects.filter(losses__gt=0).exists()

            # Killed, it comes back under the same name at once: its name
            # lock went with its transaction, not with a pooled session.
            worker.send_signal(signal.SIGKILL)
            assert worker.wait(timeout=10) == -signal.SIGKILL
            again = self.worker("pooled", *args, env=env)
            assert again.poll() is None, self.log(again)
            more = self.start_runs(3)
            assert self.wait_for_ends(more) == {"completed": len(more)}, self.log(again)[-3000:]
            for proc in (worker, again):
                log = self.log(proc)
                assert "unavailable" not in log and "not migrated" not in log, log[-3000:]
            self.stop(again, "pooled")
