"""
An idempotent start that loses its race inside a caller's transaction under
REPEATABLE READ: MariaDB's default reads the winner (a locking read);
PostgreSQL's REPEATABLE READ cannot see it, and says so clearly.
"""

from __future__ import annotations

import threading
from unittest import skipUnless

from django.db import connection, connections, transaction
from django.test import TransactionTestCase

from pikku_django.errors import IdempotencySnapshotError
from pikku_django.models import WorkflowRun
from pikku_django.workflows import start_workflow


def start_elsewhere(key: str) -> WorkflowRun:
    """The same start, committed by another connection (a thread has its own)."""
    started: list[WorkflowRun] = []

    def start() -> None:
        try:
            started.append(start_workflow("test.double", 1, idempotency_key=key))
        finally:
            connections.close_all()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(timeout=30)
    assert started, "the other connection's start did not finish"
    return started[0]


class RepeatableReadStartTests(TransactionTestCase):
    @skipUnless(connection.vendor == "mysql", "MySQL's and MariaDB's REPEATABLE READ")
    def test_the_loser_inside_a_repeatable_read_transaction_gets_the_winners_run(self) -> None:
        # The server's default, which a project gets with OPTIONS
        # {"isolation_level": "repeatable read"} (Django's own default is READ COMMITTED).
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # The transaction's snapshot is taken here, before the other start.
            assert not WorkflowRun.objects.filter(idempotency_key="rr").exists()
            winner = start_elsewhere("rr")
            assert not WorkflowRun.objects.filter(idempotency_key="rr").exists()  # the old snapshot
            run = start_workflow("test.double", 2, idempotency_key="rr")
        assert (run.pk, run.input) == (winner.pk, 1)
        assert WorkflowRun.objects.filter(idempotency_key="rr").count() == 1

    @skipUnless(connection.vendor == "postgresql", "PostgreSQL's REPEATABLE READ snapshot")
    def test_a_snapshot_that_cannot_see_the_winner_is_a_clear_error(self) -> None:
        refused = self.assertRaisesRegex(IdempotencySnapshotError, "^idempotency_key 'rr': a concurrent")
        with refused, transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            assert not WorkflowRun.objects.filter(idempotency_key="rr").exists()
            start_elsewhere("rr")
            start_workflow("test.double", 2, idempotency_key="rr")
        assert WorkflowRun.objects.filter(idempotency_key="rr").count() == 1
        # Under Django's default (READ COMMITTED) the loser gets the winner's run.
        with transaction.atomic():
            assert start_workflow("test.double", 3, idempotency_key="rr").input == 1
