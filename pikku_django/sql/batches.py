"""
A step write's transaction in the fewest round trips its vendor allows:
``one_transaction`` around a few statements, and on MySQL/MariaDB ``batch``,
several statements (and their transaction) sent in one round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql


@contextmanager
def one_transaction(connection: BaseDatabaseWrapper, cursor: Any) -> Iterator[None]:
    """
    One transaction around the statements of a write. On MySQL/MariaDB its
    ``START TRANSACTION`` rides in the round trip of its first statement
    (``_BeginWithFirst``) and its COMMIT is one more, where Django's
    ``atomic()`` spends two round trips switching autocommit off and on
    again and one for the COMMIT; a block that sent nothing sends neither.
    Elsewhere, and inside an atomic block, it is ``atomic()``.
    """
    if connection.vendor != "mysql" or connection.in_atomic_block or not connection.get_autocommit():
        with transaction.atomic(using=connection.alias):
            yield
        return
    begin = _BeginWithFirst(connection)
    # Outermost, so that every other wrapper (a project's instrumentation,
    # say) sees the statements as they are sent.
    connection.execute_wrappers.insert(0, begin)
    try:
        try:
            yield
        finally:
            connection.execute_wrappers.remove(begin)
    except BaseException:
        if begin.sent:
            # A broken connection has rolled back on the server already.
            with suppress(Exception):
                cursor.execute(sql.statement("transaction_rollback", connection))
        raise
    if begin.sent:
        cursor.execute(sql.statement("transaction_commit", connection))


class _BeginWithFirst:
    """
    An execute wrapper (MySQL/MariaDB, multi-statements): the first statement
    of a ``one_transaction`` block is sent after ``START TRANSACTION`` in one
    round trip, and its cursor moved on to that statement's own result, so
    its caller reads what it would have read alone.
    """

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.sent = False
        self.joined = connection.settings_dict["OPTIONS"].get("multi_statements", True)

    def __call__(self, execute: Any, text: Any, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if self.sent:
            return execute(text, params, many, context)
        self.sent = True
        begin = sql.statement("transaction_begin", self.connection)
        if many or not self.joined:
            execute(begin, None, False, context)
            return execute(text, params, many, context)
        answer = execute(f"{begin.strip()};\n{text}", params, many, context)
        with self.connection.wrap_database_errors:
            context["cursor"].nextset()
        return answer


def batch(
    connection: BaseDatabaseWrapper,
    cursor: Any,
    names: list[str],
    params: dict[str, Any],
    *,
    within: bool = False,
) -> list[Any]:
    """
    MySQL/MariaDB: the statements ``names`` in one transaction and one round
    trip (mysqlclient enables multi-statements; see ``sql.MYSQL_MARK``);
    ``within=True``: in the transaction the caller opened (``one_transaction``).
    Returns each statement's (rows matched, LAST_INSERT_ID, rows, description).
    An error stops
    the server at that statement, and the transaction is rolled back.
    """
    texts = [sql.statement(name, connection) for name in names]
    return send(connection, cursor, texts, params, within=within)


def send(
    connection: BaseDatabaseWrapper,
    cursor: Any,
    texts: list[str],
    params: dict[str, Any],
    *,
    within: bool = False,
) -> list[Any]:
    """``batch`` of statements already rendered (``texts``)."""
    results = []

    def result() -> tuple[Any, ...]:
        rows = cursor.fetchall() if cursor.description else None
        return (cursor.rowcount, cursor.lastrowid, rows, cursor.description)

    if not connection.settings_dict["OPTIONS"].get("multi_statements", True):
        # The project turned multi-statements off: the same transaction, a statement at a time.
        with nullcontext() if within else one_transaction(connection, cursor):
            for text in texts:
                cursor.execute(text, params)
                results.append(result())
        return results
    explicit = not within and connection.get_autocommit() and not connection.in_atomic_block
    if explicit:
        texts = [sql.statement("transaction_begin", connection), *texts]
        texts.append(sql.statement("transaction_commit", connection))
    try:
        cursor.execute(";\n".join(text.strip() for text in texts), params)
        results.append(result())
        with connection.wrap_database_errors:
            while cursor.nextset():
                results.append(result())
    except BaseException:
        if explicit:
            # A broken connection has rolled back on the server already.
            with suppress(Exception):
                cursor.execute(sql.statement("transaction_rollback", connection))
        raise
    return results[1:-1] if explicit else results
