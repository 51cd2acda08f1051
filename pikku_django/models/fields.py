"""Fields shared by the models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

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
