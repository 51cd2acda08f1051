"""
Prometheus metrics (the ``metrics`` extra: ``prometheus-client``), computed
from the database at each scrape by a custom collector, in a fixed number
of queries, so the figures are the database's whatever process serves them:
runs by queue and status, the oldest due run's age per queue, live workers,
start delays and step durations (histograms), attempts by outcome and lost
workers. ``metrics_view`` serves them to staff, or to a request bearing
``PIKKU_METRICS_TOKEN``.
"""

from __future__ import annotations

import hmac
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import router
from django.db.models import Count, F, Min, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from pikku_django.clock import EpochMs
from pikku_django.conf import conf
from pikku_django.managers.held import HELD, PENDING, held_items
from pikku_django.models import Lease, WorkflowRun, WorkflowStepAttempt, WorkflowWorker
from pikku_django.sql.names import names_held

__all__ = ["DURATION_BUCKETS_S", "START_DELAY_BUCKETS_S", "PikkuCollector", "metrics_view"]

#: Upper bounds of the start-delay histogram's buckets, in seconds (+Inf last).
START_DELAY_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Upper bounds of the step-duration histogram's buckets, in seconds (+Inf last).
DURATION_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class PikkuCollector(Collector):
    """Every ``pikku_*`` metric, read from the database ``using`` (the router's for runs by default)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using or router.db_for_read(WorkflowRun)
        # Workers' name locks live on the database they write to, not on a replica.
        self.locks = using or router.db_for_write(WorkflowWorker)

    def collect(self) -> Iterator[Metric]:
        now = Lease.objects.db_manager(self.using).db_now_ms()
        runs = WorkflowRun.objects.using(self.using)
        attempts = WorkflowStepAttempt.objects.using(self.using)
        queues: set[str] = set()
        yield self._by_status(runs, queues)
        yield self._oldest_due(runs, now, queues)
        yield self._workers_live()
        yield self._start_delays(runs)
        yield self._step_durations(attempts)
        yield from self._attempts(attempts)

    def _by_status(self, runs: QuerySet[WorkflowRun], queues: set[str]) -> Metric:
        """
        Runs by queue and the status a user is shown: a fan-out's items not
        released yet are ``pending``, not ``suspended`` (``managers.held``).
        """
        by_status = GaugeMetricFamily(
            "pikku_runs", "Runs kept, by queue and status.", labels=["queue", "status"]
        )
        counts = {
            (queue, status): count
            for queue, status, count in runs.order_by().values_list("queue", "status").annotate(n=Count("pk"))
        }
        for queue, count in runs.filter(held_items()).order_by().values_list("queue").annotate(n=Count("pk")):
            counts[(queue, HELD)] -= count
            counts[(queue, PENDING)] = count
        for (queue, status), count in counts.items():
            queues.add(queue)
            by_status.add_metric([queue, status], count)
        return by_status

    def _oldest_due(self, runs: QuerySet[WorkflowRun], now: int, queues: set[str]) -> Metric:
        oldest = GaugeMetricFamily(
            "pikku_queue_oldest_due_seconds",
            "Age of the oldest due run per queue on the database clock (0 when none is due).",
            labels=["queue"],
        )
        due = dict(
            runs.filter(status="running", wake_at__lte=now)
            .order_by()
            .values_list("queue")
            .annotate(oldest=Min("wake_at"))
        )
        for queue in sorted(queues | set(due)):
            wake_at = due.get(queue)
            oldest.add_metric([queue], 0.0 if wake_at is None else max(now - wake_at, 0) / 1000)
        return oldest

    def _workers_live(self) -> Metric:
        # A worker lives while it holds its name's lock; its row says who it is.
        holders = WorkflowWorker.objects.using(self.using).values_list("holder", flat=True)
        live = names_held(self.locks, holders)
        return GaugeMetricFamily(
            "pikku_workers_live", "Worker processes running now (holding their name's lock).", value=len(live)
        )

    def _start_delays(self, runs: QuerySet[WorkflowRun]) -> Metric:
        first_start = (
            WorkflowStepAttempt.objects.filter(step__run=OuterRef("pk"), running_at__isnull=False)
            .order_by("running_at")
            .values("running_at")[:1]
        )
        started = runs.annotate(started=Subquery(first_start)).filter(started__isnull=False)
        delays = started.annotate(ms=EpochMs("started") - EpochMs("created_at"))
        return _histogram(
            "pikku_start_delay_seconds",
            "From a run's creation to its first attempt's start, per queue (runs kept).",
            "queue",
            "queue",
            delays,
            START_DELAY_BUCKETS_S,
        )

    def _step_durations(self, attempts: QuerySet[WorkflowStepAttempt]) -> Metric:
        ended = attempts.filter(running_at__isnull=False).filter(
            Q(succeeded_at__isnull=False) | Q(failed_at__isnull=False)
        )
        durations = ended.annotate(
            ms=EpochMs(Coalesce("succeeded_at", "failed_at")) - EpochMs("running_at"),
            workflow=F("step__run__workflow"),
        )
        return _histogram(
            "pikku_step_duration_seconds",
            "How long each ended step attempt ran, per workflow (attempts kept).",
            "workflow",
            "workflow",
            durations,
            DURATION_BUCKETS_S,
        )

    def _attempts(self, attempts: QuerySet[WorkflowStepAttempt]) -> Iterator[Metric]:
        # A lost attempt's row stays "running" while a later attempt took its step.
        lost = attempts.filter(status="running", attempt__lt=F("step__attempt")).count()
        outcomes = dict(
            attempts.filter(status__in=("succeeded", "failed"))
            .order_by()
            .values_list("status")
            .annotate(n=Count("pk"))
        )
        total = CounterMetricFamily("pikku_attempts", "Step attempts ended, by outcome.", labels=["outcome"])
        for outcome in ("succeeded", "failed"):
            total.add_metric([outcome], outcomes.get(outcome, 0))
        total.add_metric(["lost"], lost)
        yield total
        yield CounterMetricFamily("pikku_worker_lost", "Step attempts whose worker was lost.", value=lost)


def _histogram(
    name: str, documentation: str, label: str, field: str, rows: QuerySet[Any], bounds: Sequence[float]
) -> Metric:
    """
    A histogram of ``rows``' ``ms`` annotation per ``field``, its buckets
    counted by the database in one query (cumulative, as Prometheus reads them).
    """
    counts = {
        f"le_{index}": Count("pk", filter=Q(ms__lte=bound * 1000)) for index, bound in enumerate(bounds)
    }
    family = HistogramMetricFamily(name, documentation, labels=[label])
    grouped: dict[str, dict[str, Any]] = defaultdict(dict)
    for row in rows.order_by().values(field).annotate(n=Count("pk"), total=Sum("ms"), **counts):
        grouped[str(row[field])] = row
    for key, row in sorted(grouped.items()):
        buckets = [(_bound(bound), row[f"le_{index}"]) for index, bound in enumerate(bounds)]
        buckets.append(("+Inf", row["n"]))
        family.add_metric([key], buckets, (row["total"] or 0) / 1000)
    return family


def _bound(value: float) -> str:
    return str(float(value))


def render(using: str | None = None) -> bytes:
    """Every metric in Prometheus' text format, read from the database now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PikkuCollector(using))
    return generate_latest(registry)


def allowed(request: HttpRequest) -> bool:
    """Staff, or a request bearing ``Authorization: Bearer <PIKKU_METRICS_TOKEN>``."""
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = conf.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), str(token))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``metrics/``: the Prometheus text, for staff or the bearer of ``PIKKU_METRICS_TOKEN``; else 403."""
    if not allowed(request):
        return HttpResponseForbidden("Staff, or Authorization: Bearer <PIKKU_METRICS_TOKEN>.")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
