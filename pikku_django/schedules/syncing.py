"""
``PIKKU_SCHEDULES`` synced into ``WorkflowSchedule`` rows, safely across a
rolling deploy.

Each setting a process syncs is recorded by fingerprint with the time it was
first seen on the database clock (``WorkflowScheduleSetting``). A process whose
setting was first seen before the newest one writes nothing (an old pod
restarted mid-rollout, an old container running ``pikku_schedules``); every
write is also guarded by the row's ``setting_seen_at``, so a setting never
overwrites a row that a newer one wrote, even when the two race. Each row a
setting names (or disables) carries that setting's first-seen time, and the
scheduler ticks only the rows of the newest (``newest_rows``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import Callable
from typing import Any

from django.core.signals import setting_changed
from django.db import DatabaseError, IntegrityError, router
from django.db.models import Max, Q
from django.dispatch import receiver

from pikku_django.clock import DbNow, DbNowMs
from pikku_django.models import WorkflowSchedule, WorkflowScheduleSetting
from pikku_django.outages import OUTAGE_ERRORS
from pikku_django.schedules import config as schedule_config
from pikku_django.sql.conflicts import in_transaction

logger = logging.getLogger(__name__)

#: Per database alias: the fingerprint of the setting this process last synced.
_synced: dict[str, str] = {}
_logged: set[str] = set()
#: (alias, fingerprint) of settings this process found older than the newest synced one.
_stale: set[tuple[str, str]] = set()

Entries = dict[str, schedule_config.ScheduleEntry]


@receiver(setting_changed)
def _forget_sync(*, setting: str, **kwargs: Any) -> None:
    if setting == "PIKKU_SCHEDULES":
        _synced.clear()
        _logged.clear()
        _stale.clear()


def alias_of(using: str | None) -> str:
    return using or router.db_for_write(WorkflowSchedule)


def read_setting() -> tuple[Entries, set[str], str]:
    """The valid entries, the names of the bad ones (logged once per setting), and its fingerprint."""
    entries, bad = schedule_config.read()
    fingerprint = schedule_config.fingerprint(entries)
    if bad and fingerprint not in _logged:
        _logged.add(fingerprint)
        for problems in bad.values():
            for check_id, message, _ in problems:
                logger.error("%s (%s); that schedule is left as it was.", message, check_id)
    return entries, set(bad), fingerprint


def _differs(row: WorkflowSchedule, entry: schedule_config.ScheduleEntry) -> dict[str, Any]:
    return {key: value for key, value in entry.fields().items() if getattr(row, key) != value}


def _seen(alias: str, digest: str) -> tuple[int | None, int | None]:
    """When the setting ``digest`` was first seen, and the newest first-seen time of any setting."""
    found = WorkflowScheduleSetting.objects.using(alias).aggregate(
        mine=Max("first_seen_at", filter=Q(fingerprint=digest)), newest=Max("first_seen_at")
    )
    return found["mine"], found["newest"]


def _first_seen(alias: str, fingerprint: str) -> tuple[int, bool]:
    """This setting's first-seen time (recorded now if it is new), and whether a newer one was synced."""
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()
    mine, newest = _seen(alias, digest)
    if mine is None:
        # A savepoint: a process that recorded it first wins, quietly.
        with contextlib.suppress(IntegrityError):
            in_transaction(
                alias,
                lambda: WorkflowScheduleSetting(fingerprint=digest, first_seen_at=DbNowMs()).save(
                    force_insert=True, using=alias
                ),
            )
        mine, newest = _seen(alias, digest)
    assert mine is not None and newest is not None
    return mine, mine < newest


def _create(alias: str, name: str, entry: schedule_config.ScheduleEntry, seen: int) -> None:
    WorkflowSchedule(
        name=name,
        start_after=DbNowMs(),
        setting_seen_at=seen,
        created_at=DbNow(),
        updated_at=DbNow(),
        **entry.fields(),
    ).save(force_insert=True, using=alias)


def _each(alias: str, name: str, write: Callable[[], object]) -> None:
    """One entry's write, in a savepoint: one the database refuses is logged, never stopping the others."""
    try:
        in_transaction(alias, write)
    except IntegrityError:
        pass  # another process created it first
    except OUTAGE_ERRORS:
        raise
    except DatabaseError:
        logger.exception("Schedule %r could not be synced; the others are.", name)


def write(
    alias: str, rows: list[WorkflowSchedule], entries: Entries, keep: set[str], fingerprint: str
) -> None:
    """Write the setting over the rows, unless a newer setting was synced; remember it as synced."""
    seen, stale = _first_seen(alias, fingerprint)
    _synced[alias] = fingerprint
    if stale:
        _stale.add((alias, fingerprint))
        logger.warning(
            "PIKKU_SCHEDULES of this process is older than the newest one synced (a deploy under "
            "way?): it is not written, and the newest setting's schedules tick."
        )
        return
    # Every write below is guarded: a newer setting's row is never overwritten.
    schedules = WorkflowSchedule.objects.db_manager(alias).filter(setting_seen_at__lte=seen)
    by_name = {row.name: row for row in rows}
    for name, entry in entries.items():
        row = by_name.get(name)
        if row is None:
            _each(alias, name, functools.partial(_create, alias, name, entry, seen))
            continue
        changes = _differs(row, entry)
        if not row.enabled:
            changes["enabled"] = True
        if changes:
            # A new cron, time zone or a return to the setting starts afresh:
            # the ticks before it are not "missed".
            if {"cron", "timezone", "enabled"} & set(changes):
                changes["resumed_at"] = DbNowMs()
            update = schedules.filter(pk=row.pk).update
            _each(alias, name, functools.partial(update, **changes, setting_seen_at=seen, updated_at=DbNow()))
    named = set(entries) | keep
    schedules.filter(name__in=named, setting_seen_at__lt=seen).update(setting_seen_at=seen)
    gone = [row.pk for row in rows if row.name not in named and (row.enabled or row.setting_seen_at < seen)]
    if gone:
        schedules.filter(pk__in=gone).update(enabled=False, setting_seen_at=seen, updated_at=DbNow())


def out_of_sync(
    alias: str, rows: list[WorkflowSchedule], entries: Entries, bad: set[str], fingerprint: str
) -> bool:
    if (alias, fingerprint) in _stale:
        return False  # a newer setting was synced: this process writes nothing
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


def newest_rows(rows: list[WorkflowSchedule]) -> list[WorkflowSchedule]:
    """The rows that tick: enabled, not paused, and named by the newest synced setting."""
    newest = max((row.setting_seen_at for row in rows), default=0)
    return [row for row in rows if row.enabled and not row.paused and row.setting_seen_at == newest]


def sync(using: str | None = None) -> None:
    """Bring the schedule rows in line with ``PIKKU_SCHEDULES`` (``tick()`` does this when needed)."""
    alias = alias_of(using)
    entries, bad, fingerprint = read_setting()
    write(alias, list(WorkflowSchedule.objects.db_manager(alias).all()), entries, bad, fingerprint)
