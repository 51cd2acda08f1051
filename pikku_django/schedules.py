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

import datetime
import logging
import time
from collections import deque
from typing import Any

from django.core.signals import setting_changed
from django.db import IntegrityError, router, transaction
from django.dispatch import receiver

from pikku_django import cron, schedule_config
from pikku_django.clock import DbNow, DbNowMs
from pikku_django.cron import ticks
from pikku_django.errors import ScheduleNotFoundError
from pikku_django.managers import ACTIVE_RUN_STATUSES
from pikku_django.models import CatchUp, Overlap, Skipped, WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from pikku_django.outages import OUTAGE_ERRORS

logger = logging.getLogger(__name__)

#: A tick a pass first sees more than this late was missed (downtime): its
#: schedule's catch_up policy decides; a tick seen sooner simply runs.
LATE_MS = 60_000
#: Missed ticks are recorded one by one this far back (or catch_up_window_ms,
#: if longer); older ones are passed over, the newest recorded tick standing for them.
HORIZON_MS = 86_400_000
#: A pass records at most this many ticks of one schedule, oldest first (the
#: next pass goes on from the newest it recorded), so that catching up after
#: a long downtime is many short transactions rather than one long one.
MAX_TICKS_PER_PASS = 1000

#: How long this process leaves a schedule alone after its ticks could not
#: be recorded (a task that no longer imports, an input too large), so that
#: a broken schedule is logged twice a minute, not on every pass.
FAILURE_PAUSE_S = 30.0

#: Per database alias: the fingerprint of the setting this process last synced.
_synced: dict[str, str] = {}
_logged: set[str] = set()
#: Per (alias, schedule id): the monotonic time before which this process does not try it again.
_failing: dict[tuple[str, Any], float] = {}


@receiver(setting_changed)
def _forget_sync(*, setting: str, **kwargs: Any) -> None:
    if setting == "PIKKU_SCHEDULES":
        _synced.clear()
        _logged.clear()
        _failing.clear()


def _alias(using: str | None) -> str:
    return using or router.db_for_write(WorkflowSchedule)


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


# -- the setting, synced ------------------------------------------------------


def _differs(row: WorkflowSchedule, entry: schedule_config.ScheduleEntry) -> dict[str, Any]:
    return {key: value for key, value in entry.fields().items() if getattr(row, key) != value}


def _write(
    alias: str,
    rows: list[WorkflowSchedule],
    entries: dict[str, schedule_config.ScheduleEntry],
    keep: set[str],
) -> None:
    schedules = WorkflowSchedule.objects.db_manager(alias)
    by_name = {row.name: row for row in rows}
    for name, entry in entries.items():
        row = by_name.get(name)
        if row is None:
            try:
                # A savepoint: a process that created it first wins, quietly.
                with transaction.atomic(using=alias):
                    WorkflowSchedule(
                        name=name,
                        start_after=DbNowMs(),
                        created_at=DbNow(),
                        updated_at=DbNow(),
                        **entry.fields(),
                    ).save(force_insert=True, using=alias)
            except IntegrityError:
                pass
            continue
        changes = _differs(row, entry)
        if not row.enabled:
            changes["enabled"] = True
        if changes:
            # A new cron, time zone or a return to the setting starts afresh:
            # the ticks before it are not "missed".
            if {"cron", "timezone", "enabled"} & set(changes):
                changes["resumed_at"] = DbNowMs()
            schedules.filter(pk=row.pk).update(**changes, updated_at=DbNow())
    gone = [row.pk for row in rows if row.enabled and row.name not in entries and row.name not in keep]
    if gone:
        schedules.filter(pk__in=gone).update(enabled=False, updated_at=DbNow())


def _read_setting() -> tuple[dict[str, schedule_config.ScheduleEntry], set[str], str]:
    entries, bad = schedule_config.read()
    fingerprint = schedule_config.fingerprint(entries)
    if bad and fingerprint not in _logged:
        _logged.add(fingerprint)
        for problems in bad.values():
            for check_id, message, _ in problems:
                logger.error("%s (%s); that schedule is left as it was.", message, check_id)
    return entries, set(bad), fingerprint


def sync(using: str | None = None) -> None:
    """Bring the schedule rows in line with ``PIKKU_SCHEDULES`` (``tick()`` does this when needed)."""
    alias = _alias(using)
    entries, bad, fingerprint = _read_setting()
    _write(alias, list(WorkflowSchedule.objects.db_manager(alias).all()), entries, bad)
    _synced[alias] = fingerprint


def _out_of_sync(
    alias: str, rows: list[WorkflowSchedule], entries: dict[str, Any], bad: set[str], fingerprint: str
) -> bool:
    by_name = {row.name: row for row in rows}
    if any(name not in by_name for name in entries):
        return True  # a new entry (or a database emptied under us): always
    # Rows that differ are rewritten once per setting this process knows, not
    # on every pass: during a deploy, processes on the old and on the new
    # setting would otherwise take turns rewriting them.
    if _synced.get(alias) == fingerprint:
        return False
    return any(
        (row.name in entries and (not row.enabled or _differs(row, entries[row.name])))
        or (row.enabled and row.name not in entries and row.name not in bad)
        for row in rows
    )


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
    entries, bad, fingerprint = _read_setting()
    schedules = WorkflowSchedule.objects.db_manager(alias)
    rows = list(schedules.with_last_tick())
    if _out_of_sync(alias, rows, entries, bad, fingerprint):
        _write(alias, rows, entries, bad)
        _synced[alias] = fingerprint
        rows = list(schedules.with_last_tick())
    recorded: list[WorkflowScheduleTick] = []
    soonest: float | None = None
    for row in rows:
        if not row.enabled or row.paused:
            continue
        wait = max(0.0, (next_tick_at(row) - _annotated(row, "db_now_ms")) / 1000)
        failing = _failing.get((alias, row.pk), 0.0) - time.monotonic()
        soonest = min(max(wait, failing), soonest if soonest is not None else float("inf"))
        if wait > 0 or failing > 0:
            continue
        try:
            recorded += _record_due(alias, row.pk)
        except OUTAGE_ERRORS:
            raise
        except IntegrityError:
            # Another pass recorded these ticks first; ours rolled back whole.
            logger.debug("Schedule %r: another pass recorded its due ticks first.", row.name)
        except Exception:
            _failing[(alias, row.pk)] = time.monotonic() + FAILURE_PAUSE_S
            logger.exception(
                "Schedule %r: its due ticks could not be recorded; this process tries again in %g s.",
                row.name,
                FAILURE_PAUSE_S,
            )
        else:
            _failing.pop((alias, row.pk), None)
    return recorded, soonest


def _due(schedule: WorkflowSchedule, after: int, now: int) -> list[int]:
    """The ticks in (after, now], the last day's (or window's) of them one by one."""
    horizon = max(HORIZON_MS, schedule.catch_up_window_ms if schedule.catch_up == CatchUp.ALL else 0)
    start = max(after, now - horizon)
    found: deque[int] = deque()
    at = cron.next_after_ms(schedule.cron, schedule.timezone, start)
    while at <= now:
        found.append(at)
        at = cron.next_after_ms(schedule.cron, schedule.timezone, at)
    if not found and start > after:
        # A sparse cron: its newest tick before the horizon is the one missed.
        at = cron.next_after_ms(schedule.cron, schedule.timezone, after)
        while at <= start:
            found = deque([at])
            at = cron.next_after_ms(schedule.cron, schedule.timezone, at)
    return list(found)


def _plan(schedule: WorkflowSchedule, due: list[int], now: int) -> list[tuple[int, str]]:
    """Each due tick with ``""`` (it runs) or why it is skipped, under the catch_up policy."""
    late = [at for at in due if now - at > LATE_MS]
    if schedule.catch_up == CatchUp.LATEST:
        runs = set(late[-1:])
    elif schedule.catch_up == CatchUp.ALL:
        runs = {at for at in late if now - at <= schedule.catch_up_window_ms}
    else:
        runs = set()
    return [(at, "" if at in runs or now - at <= LATE_MS else Skipped.CATCH_UP.value) for at in due]


def _record_due(alias: str, pk: Any) -> list[WorkflowScheduleTick]:
    schedules = WorkflowSchedule.objects.db_manager(alias)
    with transaction.atomic(using=alias):
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
    from pikku_django.tasks.results import resolve_task

    task = resolve_task(schedule.task)
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
    from pikku_django.tasks.compat import TaskResultDoesNotExist, TaskResultStatus
    from pikku_django.tasks.results import resolve_task

    try:
        status = resolve_task(schedule.task).get_result(last.task_result_id).status
    except (TaskResultDoesNotExist, NotImplementedError):
        return False
    return status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)


# -- by hand: trigger, pause, resume -----------------------------------------


def _get(name: str, alias: str) -> WorkflowSchedule:
    try:
        return WorkflowSchedule.objects.db_manager(alias).get(name=name)
    except WorkflowSchedule.DoesNotExist:
        raise ScheduleNotFoundError(name) from None


def trigger(name: str, *, using: str | None = None) -> WorkflowScheduleTick:
    """Record a manual tick of the schedule ``name`` at the database clock's now, and start its run."""
    alias = _alias(using)
    schedule = _get(name, alias)
    if not schedule.enabled:
        raise ScheduleNotFoundError(name, "it is disabled (no longer in PIKKU_SCHEDULES)")
    schedules = WorkflowSchedule.objects.db_manager(alias)
    with transaction.atomic(using=alias):
        schedules.get_queryset().hold(schedule.pk, wait=True)
        now = schedules.annotate(now=DbNowMs()).values_list("now", flat=True).get(pk=schedule.pk)
        taken = set(
            WorkflowScheduleTick.objects.db_manager(alias)
            .filter(schedule=schedule, tick_at__gte=now, tick_at__lt=now + 1000)
            .values_list("tick_at", flat=True)
        )
        at = next(ms for ms in range(now, now + 1001) if ms not in taken)
        row = WorkflowScheduleTick(schedule=schedule, tick_at=at, manual=True, created_at=DbNow())
        _start(alias, schedule, row)
        return _insert(alias, [row])[0]


def pause(name: str, *, using: str | None = None) -> bool:
    """Pause the schedule ``name``; False if it was paused already."""
    alias = _alias(using)
    return (
        WorkflowSchedule.objects.db_manager(alias).get_queryset().filter(pk=_get(name, alias).pk).pause() == 1
    )


def resume(name: str, *, using: str | None = None) -> bool:
    """Resume the schedule ``name`` (the ticks it missed never run); False if it was not paused."""
    alias = _alias(using)
    return (
        WorkflowSchedule.objects.db_manager(alias).get_queryset().filter(pk=_get(name, alias).pk).resume()
        == 1
    )


def scheduled_at(run: WorkflowRun, *, using: str | None = None) -> datetime.datetime | None:
    """The instant of the tick that started ``run`` (aware UTC), or None if no schedule did."""
    alias = using or run._state.db or router.db_for_read(WorkflowScheduleTick)
    at = (
        WorkflowScheduleTick.objects.db_manager(alias)
        .filter(run_id=run.pk)
        .values_list("tick_at", flat=True)
        .first()
    )
    return None if at is None else datetime.datetime.fromtimestamp(at / 1000, tz=datetime.timezone.utc)


__all__ = [
    "HORIZON_MS",
    "LATE_MS",
    "MAX_TICKS_PER_PASS",
    "idempotency_key",
    "next_tick_at",
    "pause",
    "resume",
    "scheduled_at",
    "sync",
    "tick",
    "ticks",
    "trigger",
]
