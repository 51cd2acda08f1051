"""
Rate buckets of flow control (re-exported by ``pikku_django.models``): one
row per bucket (a queue's, or one key's of it), its GCRA state.
"""

from __future__ import annotations

from django.db import models

from pikku_django import validate
from pikku_django.models.fields import ExactCharField


class FlowBucket(models.Model):
    """
    A rate limit's bucket (``PIKKU_QUEUES[q]["rate"]``): ``tat``, the
    theoretical arrival time of the next start (epoch ms on the database
    clock), advanced by one guarded UPDATE per start (``store.flow.admit``).
    """

    key = ExactCharField(max_length=255, primary_key=True)
    tat = models.BigIntegerField(help_text="Epoch ms on the database clock: the next start's arrival time.")

    class Meta:
        db_table = "pikku_flow_bucket"

    def __str__(self) -> str:
        return f"rate bucket {self.key}"


class FlowKey(models.Model):
    """
    A key of a queue with ``per_key`` (``""`` for its runs without a key),
    and its turn: the queue's serve count when a run of the key was last
    taken (``store.fairness``). The due look of such a queue puts the key
    served longest ago first.
    """

    queue = models.CharField(max_length=validate.MAX_QUEUE_LENGTH)
    key = ExactCharField(max_length=255)
    served = models.BigIntegerField(help_text="The queue's serve count at this key's last take.")

    class Meta:
        db_table = "pikku_flow_key"
        constraints = [models.UniqueConstraint(fields=["queue", "key"], name="pikku_flow_key_uniq")]

    def __str__(self) -> str:
        return f"{self.queue} key {self.key!r}"
