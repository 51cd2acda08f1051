"""
"Not migrated" is decided from the server's code for a missing table, never
from a message: a pooler's "prepared statement ... does not exist" is no
missing table, and a worker meeting it must not exit as "not migrated".
"""

from __future__ import annotations

from django.db import DatabaseError, connection
from django.test import TransactionTestCase

from pikku_django.outages import is_schema_error

#: A statement whose error says "does not exist" of something that is not a
#: table, as a pooler's lost prepared statement does, on each database.
NOT_A_TABLE = {
    "postgresql": "DEALLOCATE pikku_no_such_statement",
    "mysql": "SHOW CREATE PROCEDURE pikku_no_such_procedure",
    "sqlite": "SELECT pikku_no_such_function()",
}


def error_of(sql: str) -> DatabaseError:
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as error:
        return error
    raise AssertionError(f"{sql!r} raised nothing")


class SchemaErrorTests(TransactionTestCase):
    def test_a_missing_table_is_not_migrated(self) -> None:
        assert is_schema_error(error_of("SELECT * FROM pikku_no_such_table"))

    def test_a_message_that_says_does_not_exist_of_something_else_is_not(self) -> None:
        error = error_of(NOT_A_TABLE[connection.vendor])
        if connection.vendor != "sqlite":
            assert "does not exist" in str(error), error
        assert not is_schema_error(error)

    def test_an_error_with_no_code_is_not(self) -> None:
        assert not is_schema_error(RuntimeError("relation pikku_lease does not exist"))
