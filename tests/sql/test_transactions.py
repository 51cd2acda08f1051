"""
``managers.batches.one_transaction``, the transaction around a pass's writes:
all of its statements commit together or none does, whatever rides in the
round trip of its first statement (MySQL/MariaDB send ``START TRANSACTION``
with it), and a block that sends nothing costs nothing there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections
from django.test import TransactionTestCase

from pikku_django.models import Lease
from pikku_django.sql.batches import one_transaction
from pikku_django.sql.cursors import hot_cursor


class Boom(Exception):
    pass


def stored_keys() -> list[str]:
    """The lease keys another connection reads: what has committed."""
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT {other.ops.quote_name('key')} FROM {Lease._meta.db_table}")  # noqa: S608
            return sorted(row[0] for row in cursor.fetchall())
    finally:
        other.close()


@contextmanager
def one() -> Iterator[None]:
    """One ``one_transaction`` block on the default connection."""
    with hot_cursor(connection) as cursor, one_transaction(connection, cursor):
        yield


class Sent:
    """An execute wrapper installed before the block: the statements as sent."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.texts.append(" ".join(str(sql).split()))
        return execute(sql, params, many, context)


class OneTransactionTests(TransactionTestCase):
    def test_its_statements_commit_together(self) -> None:
        with one():
            Lease.objects.create(key="tx:a", holder="h", token=1, expires_at=0)
            assert stored_keys() == []
            Lease.objects.create(key="tx:b", holder="h", token=1, expires_at=0)
        assert stored_keys() == ["tx:a", "tx:b"]
        # Autocommit again: a write after the block commits on its own.
        Lease.objects.create(key="tx:c", holder="h", token=1, expires_at=0)
        assert stored_keys() == ["tx:a", "tx:b", "tx:c"]

    def test_an_error_after_the_first_statement_rolls_the_first_back_too(self) -> None:
        with self.assertRaises(Boom), one():
            Lease.objects.create(key="tx:a", holder="h", token=1, expires_at=0)
            raise Boom
        assert stored_keys() == []
        Lease.objects.create(key="tx:c", holder="h", token=1, expires_at=0)
        assert stored_keys() == ["tx:c"]

    def test_a_failed_first_statement_leaves_no_transaction_open(self) -> None:
        Lease.objects.create(key="tx:a", holder="h", token=1, expires_at=0)
        with self.assertRaises(IntegrityError), one():
            Lease.objects.create(key="tx:a", holder="other", token=1, expires_at=0)
        Lease.objects.create(key="tx:b", holder="h", token=1, expires_at=0)
        assert stored_keys() == ["tx:a", "tx:b"]
        assert Lease.objects.get(key="tx:a").holder == "h"

    def test_on_mysql_the_begin_rides_with_the_first_statement_and_an_empty_block_sends_nothing(self) -> None:
        if connection.vendor != "mysql":
            self.skipTest("the round trips of MySQL/MariaDB's transaction")
        connection.ensure_connection()
        sent = Sent()
        with connection.execute_wrapper(sent):
            with one():
                pass
            assert sent.texts == []
            with one():
                Lease.objects.create(key="tx:a", holder="h", token=1, expires_at=0)
                Lease.objects.create(key="tx:b", holder="h", token=1, expires_at=0)
        assert len(sent.texts) == 3, sent.texts
        assert sent.texts[0].startswith("START TRANSACTION; INSERT"), sent.texts
        assert sent.texts[1].startswith("INSERT") and sent.texts[2] == "COMMIT"
        assert stored_keys() == ["tx:a", "tx:b"]
