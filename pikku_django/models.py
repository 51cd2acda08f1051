"""Leases and workflow runs, steps and attempts."""

from __future__ import annotations

import datetime
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django import sql
from pikku_django.managers import LeaseManager


class ExactCharField(models.CharField):  # type: ignore[type-arg]
    """A CharField compared byte for byte on every database (see ``sql.exact_collation``)."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        return sql.exact_char_type(connection, self.max_length or 255) or super().db_type(connection)

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params = super().db_parameters(connection)
        params["collation"] = sql.exact_collation(connection) or params.get("collation")
        return params


class Lease(models.Model):
    """
    A named lease: ``holder`` holds ``key`` until ``expires_at`` (epoch ms on the
    database's clock). ``token`` rises every time the key changes hands, so work
    done under a lease can be fenced against an older holder.
    """

    key = ExactCharField(max_length=255, primary_key=True)
    holder = ExactCharField(max_length=255)
    token = models.BigIntegerField()
    expires_at = models.BigIntegerField(help_text="Epoch milliseconds on the database clock.")

    objects = LeaseManager()

    class Meta:
        db_table = "pikku_lease"
        indexes = [models.Index(fields=["expires_at"], name="pikku_lease_expires_idx")]

    def __str__(self) -> str:
        return f"{self.key} (token {self.token}, {self.holder})"

    @property
    def expires(self) -> datetime.datetime:
        """``expires_at`` as an aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.expires_at / 1000, tz=datetime.timezone.utc)
