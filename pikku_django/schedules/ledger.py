"""
Schedules: ``PIKKU_SCHEDULES`` synced into ``WorkflowSchedule`` rows, and
``tick()``, one scheduler pass, safe from any number of processes at once.

Exactly once per tick: a pass holds a due schedule's row (``hold``), reads
its newest recorded tick and the database clock's now, and records each due
tick in the ledger in the same transaction as the run it starts (or the task
it enqueues). The ledger's unique (schedule, tick_at) refuses a second record
of one tick, whoever tries; a tick at or before the newest recorded one is
never due again, so pruning runs (or all but the newest ledger row) cannot
make it run twice.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from typing import Any

from django.core.signals import setting_changed
from django.db import IntegrityError
from django.dispatch import receiver

from pikku_django.clock import DbNow
from pikku_django.managers import ACTIVE_RUN_STATUSES
from pikku_django.models import CatchUp, Overlap, Skipped, WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.schedules import config as schedule_config
from pikku_django.schedules import cron, syncing
from pikku_django.schedules.cron import ticks
from pikku_django.schedules.syncing import sync
from pikku_django.sql.conflicts import in_transaction

logger = logging.getLogger(__name__)

#: A tick a pass first sees more than this late was missed (downtime): its
#: schedule's catch_up policy decides; a tick seen sooner simply runs.
LATE_MS = 60_000
#: The first window a pass looks back for missed ticks; it grows (fourfold)
#: until it reaches the last recorded tick or holds MAX_TICKS_PER_PASS ticks.
HORIZON_MS = 86_400_000
#: Every missed tick is recorded back to the last recorded one, up to the
#: newest this many (older ones are passed over, the newest recorded tick
#: standing for them): a pass records at most this many ticks of one schedule.
MAX_TICKS_PER_PASS = 1000

#: How long this process leaves a schedule alone after its ticks could not
#: be recorded (a task that no longer imports, an input too large), so that
#: a broken schedule is logged twice a minute, not on every pass.
FAILURE_PAUSE_S = 30.0

#: Per (alias, schedule id): the monotonic time before which this process does not try it again.
_failing: dict[tuple[str, Any], float] = {}


@receiver(setting_changed)
def _forget_failures(*, setting: str, **kwargs: Any) -> None:
    if setting == "PIKKU_SCHEDULES":
        _failing.clear()


def _alias(using: str | None) -> str:
    return syncing.alias_of(using)


def _annotated(row: Any, name: str) -> int:
    return int(getattr(row, name))


def idempotency_key(name: str, tick_at: int) -> str:
    """The key of the run a tick starts: ``schedule:<name>:<tick_at>``."""
    return f"schedule:{name}:{tick_at}"


def next_tick_at(schedule: WorkflowSchedule) -> int:
    """
    The schedule's next tick not yet recorded (epoch ms): the first after its
    newest recorded cron tick (or its first sync) and its last resume. Needs ``with_last_tick()``.
    """
    after = schedule.ticks_after(getattr(schedule, "last_tick_at", None))
    return cron.next_after_ms(schedule.cron, schedule.timezone, after)


# -- one pass -----------------------------------------------------------------


def tick(using: str | None = None) -> list[WorkflowScheduleTick]:
    """
    One scheduler pass: sync the setting (when it changed), record every due
    tick under its schedule's policies and start its run, and return the
    ledger rows this pass recorded. When nothing is due it is one SELECT.
    """
    return tick_until_next(using)[0]


def tick_until_next(using: str | None = None) -> tuple[list[WorkflowScheduleTick], float | None]:
    """
    ``tick()``, and the seconds from its read until the next tick of an
    enabled, unpaused schedule is due (0 for one due that this pass recorded
    or left; None for no schedule), for a scheduler that sleeps until then.
    """
    alias = _alias(using)
    entries, bad, fingerprint = syncing.read_setting()
    schedules = WorkflowSchedule.objects.db_manager(alias)
    rows = list(schedules.with_last_tick())
    if syncing.out_of_sync(alias, rows, entries, bad, fingerprint):
        syncing.write(alias, rows, entries, bad, fingerprint)
        rows = list(schedules.with_last_tick())
    recorded: list[WorkflowScheduleTick] = []
    soonest: float | None = None
    for row in syncing.newest_rows(rows):
        wait = _tick_one(alias, row, recorded)
        soonest = min(wait, soonest if soonest is not None else float("inf"))
    return recorded, soonest


def _tick_one(alias: str, row: WorkflowSchedule, recorded: list[WorkflowScheduleTick]) -> float:
    """
    Record one schedule's due ticks into ``recorded``; the seconds until it
    is worth trying again. Each schedule on its own: one that fails (even to
    find its next tick) is logged and left alone a while, never stopping the others.
    """
    key = (alias, row.pk)
    failing = _failing.get(key, 0.0) - time.monotonic()
    try:
        wait = max(0.0, (next_tick_at(row) - _annotated(row, "db_now_ms")) / 1000)
        if wait > 0 or failing > 0:
            return max(wait, failing)
        recorded += _record_due(alias, row.pk)
    except OUTAGE_ERRORS:
        raise
    except (IntegrityError, CannotAdvanceError) as e:
        _failing[key] = time.monotonic() + FAILURE_PAUSE_S
        logger.warning(
            "Schedule %r cannot advance (%s); this process tries again in %g s.", row.name, e, FAILURE_PAUSE_S
        )
    except Exception:
        _failing[key] = time.monotonic() + FAILURE_PAUSE_S
        logger.exception(
            "Schedule %r: its due ticks could not be recorded; this process tries again in %g s.",
            row.name,
            FAILURE_PAUSE_S,
        )
    else:
        _failing.pop(key, None)
        return 0.0
    return FAILURE_PAUSE_S


def _due(schedule: WorkflowSchedule, after: int, now: int) -> list[int]:
    """
    The ticks in (after, now], the newest ``MAX_TICKS_PER_PASS`` of them: a
    window back from now that grows until it holds that many or reaches
    ``after``, so a long downtime costs the ticks it keeps, not all it missed.
    """
    span = HORIZON_MS
    while True:
        start = max(after, now - span)
        found: deque[int] = deque(maxlen=MAX_TICKS_PER_PASS)
        at = cron.next_after_ms(schedule.cron, schedule.timezone, start)
        while at <= now:
            found.append(at)
            at = cron.next_after_ms(schedule.cron, schedule.timezone, at)
        if start == after or len(found) == MAX_TICKS_PER_PASS:
            return list(found)
        span *= 4


def _plan(schedule: WorkflowSchedule, due: list[int], now: int) -> list[tuple[int, str]]:
    """
    Each due tick with ``""`` (it runs) or why it is skipped. Ticks a pass
    finds more than ``LATE_MS`` late were missed: under ``latest`` only the
    newest due tick runs (late or not: one catch-up run, never two back to
    back), under ``all`` those within the window run, under ``none`` none.
    """
    late = {at for at in due if now - at > LATE_MS}
    if not late:
        runs = set(due)
    elif schedule.catch_up == CatchUp.LATEST:
        runs = set(due[-1:])
    elif schedule.catch_up == CatchUp.ALL:
        runs = {at for at in due if now - at <= schedule.catch_up_window_ms}
    else:
        runs = set(due) - late
    return [(at, "" if at in runs else Skipped.CATCH_UP.value) for at in due]


class CannotAdvanceError(Exception):
    """Each due tick of a schedule is recorded already, yet its newest cron tick is older."""


def _unrecorded(alias: str, schedule: WorkflowSchedule, plan: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """
    The plan without the ticks the ledger holds already (a manual tick that a
    trigger before this fix took on a cron's instant): the rest are recorded.
    """
    taken = set(
        WorkflowScheduleTick.objects.db_manager(alias)
        .filter(schedule=schedule, tick_at__gte=plan[0][0], tick_at__lte=plan[-1][0])
        .values_list("tick_at", flat=True)
    )
    rest = [(at, why) for at, why in plan if at not in taken]
    if not rest:
        raise CannotAdvanceError(f"its due ticks up to {plan[-1][0]} are recorded by hand")
    return rest


def _record_due(alias: str, pk: Any) -> list[WorkflowScheduleTick]:
    return in_transaction(alias, functools.partial(_record_due_within, alias, pk))


def _record_due_within(alias: str, pk: Any) -> list[WorkflowScheduleTick]:
    """``_record_due`` in the caller's transaction."""
    schedules = WorkflowSchedule.objects.db_manager(alias)
    if not schedules.get_queryset().hold(pk):
        return []  # another pass holds it, and records its ticks
    schedule = schedules.with_last_tick().filter(pk=pk, enabled=True, paused=False).first()
    if schedule is None:
        return []
    now = _annotated(schedule, "db_now_ms")
    after = schedule.ticks_after(getattr(schedule, "last_tick_at", None))
    plan = _plan(
        schedule,
        _due(schedule, after, now),
        now,
    )
    if not plan:
        return []  # a pass before this one recorded them
    plan = _unrecorded(alias, schedule, plan)
    busy = (
        schedule.overlap == Overlap.SKIP
        and any(why == "" for _, why in plan)
        and _has_unfinished(alias, schedule)
    )
    rows = []
    for at, why in plan[:MAX_TICKS_PER_PASS]:
        if why == "" and busy:
            why = Skipped.OVERLAP.value
        row = WorkflowScheduleTick(schedule=schedule, tick_at=at, skipped=why, created_at=DbNow())
        if why == "":
            _start(alias, schedule, row)
            busy = schedule.overlap == Overlap.SKIP
        rows.append(row)
    return _insert(alias, rows)


def _insert(alias: str, rows: list[WorkflowScheduleTick]) -> list[WorkflowScheduleTick]:
    """Insert the ledger rows in one statement; returns them as stored."""
    ledger = WorkflowScheduleTick.objects.db_manager(alias)
    ledger.bulk_create(rows)
    # Read back (one query): MySQL returns no ids from a bulk insert, and
    # created_at is the database clock's.
    stored = ledger.filter(schedule=rows[0].schedule, tick_at__in=[row.tick_at for row in rows])
    return list(stored.select_related("run").order_by("tick_at"))


def _start(alias: str, schedule: WorkflowSchedule, row: WorkflowScheduleTick) -> None:
    """Start the tick's run, or enqueue its task, on this transaction."""
    if schedule.workflow:
        row.run = WorkflowRun.objects.db_manager(alias).start_run(
            schedule.workflow,
            schedule.input,
            idempotency_key=idempotency_key(schedule.name, row.tick_at),
            queue=schedule.queue or "default",
            priority=schedule.priority or 0,
        )
        return
    task = schedule_config.resolve_task(schedule.task)
    overrides: dict[str, Any] = {}
    if schedule.queue:
        overrides["queue_name"] = schedule.queue
    if schedule.priority is not None:
        overrides["priority"] = schedule.priority
    if overrides:
        task = task.using(**overrides)
    row.task_result_id = str(task.enqueue(**(schedule.input or {})).id)


def _has_unfinished(alias: str, schedule: WorkflowSchedule) -> bool:
    """Does a run (or task) an earlier tick of the schedule started still run?"""
    ledger = WorkflowScheduleTick.objects.db_manager(alias).get_queryset().filter(schedule=schedule)
    if schedule.workflow:
        return ledger.filter(run__status__in=ACTIVE_RUN_STATUSES).exists()
    last = ledger.started().exclude(task_result_id="").order_by("-tick_at").first()
    if last is None:
        return False
    if not schedule_config.HAS_TASKS:
        return False
    return schedule_config.task_is_unfinished(schedule.task, last.task_result_id)


__all__ = [
    "HORIZON_MS",
    "LATE_MS",
    "MAX_TICKS_PER_PASS",
    "idempotency_key",
    "next_tick_at",
    "sync",
    "tick",
    "tick_until_next",
    "ticks",
]
