"""The queues' rows (``WorkflowQueue.objects``) and what the cockpit reads of each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import Count, F, Min, OuterRef, Subquery, Window
from django.db.models.functions import Coalesce, RowNumber

from pikku_django import models as pikku_models
from pikku_django.clock import DbNowMs
from pikku_django.managers.base import ACTIVE_RUN_STATUSES
from pikku_django.managers.held import SHOWN_STATUSES, shown_as

if TYPE_CHECKING:
    from pikku_django.models.queues import WorkflowQueue  # noqa: F401

#: The run statuses the cockpit counts per queue, in the order it shows them
#: (``pending``: a fan-out's items not released yet, ``managers.held``).
QUEUE_STATUSES = SHOWN_STATUSES


def _one(queryset: models.QuerySet[models.Model], aggregate: models.Aggregate) -> Subquery:
    """``aggregate`` of ``queryset`` (already tied to the outer queue), as one correlated subquery."""
    grouped = queryset.order_by().values("queue").annotate(value=aggregate).values("value")
    return Subquery(grouped, output_field=models.BigIntegerField())


class WorkflowQueueQuerySet(models.QuerySet["WorkflowQueue"]):
    def paused(self) -> WorkflowQueueQuerySet:
        return self.filter(paused=True)

    def with_stats(self) -> WorkflowQueueQuerySet:
        """
        Each queue with its figures, in this one statement whatever the
        number of runs (a correlated subquery each): ``runs_<status>``, the
        due backlog (``due``) and its oldest ``wake_at`` (``oldest_due_at``),
        the live slot leases (``slots_used``), and the database clock's
        ``db_now_ms``.
        """
        runs = pikku_models.WorkflowRun.objects.filter(queue=OuterRef("name"))
        due = runs.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lte=DbNowMs())
        counts = {
            f"runs_{status}": Coalesce(_one(runs.filter(shown_as(status)), Count("pk")), 0)
            for status in QUEUE_STATUSES
        }
        return self.annotate(
            **counts,
            due=Coalesce(_one(due, Count("pk")), 0),
            oldest_due_at=_one(due, Min("wake_at")),
            db_now_ms=DbNowMs(),
        )


def slots_in_use(alias: str) -> dict[str, int]:
    """The live slot leases (``queues.queue_slot``) of every queue, by queue, in one read."""
    leases = pikku_models.Lease.objects.using(alias)
    leases = leases.filter(key__startswith="queue:", expires_at__gt=DbNowMs())
    used: dict[str, int] = {}
    for key in leases.values_list("key", flat=True):
        queue = key[len("queue:") :].rpartition(":")[0]
        used[queue] = used.get(queue, 0) + 1
    return used


#: How many keys the cockpit names per queue.
BUSIEST_KEYS = 5


def busiest_keys(alias: str, names: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
    """
    Per queue (of ``names``, or every one), the flow-control keys with the
    most runs running or due, most first, ``BUSIEST_KEYS`` at most: one
    query, ranked by the database, whatever the number of keys.
    """
    runs = pikku_models.WorkflowRun.objects.using(alias).filter(status="running", key__isnull=False)
    if names is not None:
        runs = runs.filter(queue__in=names)
    grouped = runs.order_by().values("queue", "key").annotate(n=Count("pk"))
    rank = Window(RowNumber(), partition_by=[F("queue")], order_by=[F("n").desc(), F("key").asc()])
    top = grouped.annotate(rank=rank).filter(rank__lte=BUSIEST_KEYS).order_by("queue", "rank")
    found: dict[str, list[tuple[str, int]]] = {}
    for queue, key, count in top.values_list("queue", "key", "n"):
        found.setdefault(queue, []).append((str(key), int(count)))
    return found
