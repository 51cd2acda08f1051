"""Named leases, and the floor that keeps their tokens rising."""

from __future__ import annotations

import datetime

from django.db import models

from pikku_django.managers import LeaseManager
from pikku_django.models.fields import ExactCharField


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


class LeaseTokenFloor(models.Model):
    """
    One row that lets the sweep prune lease rows without a key's token ever
    going backwards. A key created afresh starts above ``token``. The sweep
    raises ``token`` above the rows it means to prune, and deletes only rows
    at or below ``prunable_token``: ``token`` as it stood at least
    ``sweep.PRUNE_GRACE_MS`` ago, so no acquire still in flight read an older
    floor.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    token = models.BigIntegerField(default=0)
    prunable_token = models.BigIntegerField(default=0)
    raised_at = models.BigIntegerField(default=0, help_text="Epoch ms on the database clock.")

    class Meta:
        db_table = "pikku_lease_floor"

    def __str__(self) -> str:
        return f"lease token floor {self.token}"
