"""Fields shared by the models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql import Query

from pikku_django import sql


class ExactCharField(models.CharField):  # type: ignore[type-arg]
    """A CharField compared byte for byte on every database (see ``sql.exact_collation``)."""

    def deconstruct(self) -> tuple[str, str, Sequence[Any], dict[str, Any]]:
        # Where the migrations name it: ``pikku_django.models`` re-exports it.
        name, _, args, kwargs = super().deconstruct()
        return name, "pikku_django.models.ExactCharField", args, kwargs

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        return sql.exact_char_type(connection, self.max_length or 255) or super().db_type(connection)

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params = super().db_parameters(connection)
        params["collation"] = sql.exact_collation(connection) or params.get("collation")
        return params


class PartialIndex(models.Index):
    """
    An index of the rows ``where`` holds, on a database with partial indexes
    (SQLite, PostgreSQL); of every row elsewhere (MySQL/MariaDB), without the
    check warning a ``condition`` gives there: where every row is indexed the
    planner still knows the share of NULLs and loses nothing.
    """

    def __init__(self, *args: Any, where: models.Q, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where = where

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        _, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        # Where the migrations name it: ``pikku_django.models`` re-exports it.
        return "pikku_django.models.PartialIndex", args, kwargs

    def _get_condition_sql(self, model: type[models.Model], schema_editor: Any) -> str | None:
        if not schema_editor.connection.features.supports_partial_indexes:
            return None
        query = Query(model=model, alias_cols=False)
        where = query.build_where(self.where)
        compiler = query.get_compiler(connection=schema_editor.connection)
        text, params = where.as_sql(compiler, schema_editor.connection)
        return str(text % tuple(schema_editor.quote_value(p) for p in params))
