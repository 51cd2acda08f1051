"""
``PIKKU_SCHEDULES`` read and checked: each entry becomes a ``ScheduleEntry``,
or a list of problems (check id, message, hint) that the system checks report
and the scheduler logs, leaving that entry's stored schedule as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pikku_django import validate
from pikku_django.conf import conf
from pikku_django.errors import InvalidArgumentError, TaskPathError, WorkflowNotFoundError
from pikku_django.models.schedules import MAX_SCHEDULE_NAME_LENGTH, CatchUp, Overlap
from pikku_django.schedules import cron
from pikku_django.workflows.registry import get_workflow

try:
    from pikku_django.tasks.results import resolve_task as resolve_task
    from pikku_django.tasks.results import task_is_unfinished as task_is_unfinished

    HAS_TASKS = True
except ImportError:  # Django 5.2 without the django-tasks backport: schedules of tasks are refused
    HAS_TASKS = False

#: Stable check ids (documented in docs/settings.md), one per kind of problem.
SETTING_ID = "pikku_django.E030"  # not a dict of names to dicts
TARGET_ID = "pikku_django.E031"  # no or two targets, or a task path that names something else
#: A warning, not an error: a typo in PIKKU_SCHEDULES must not stop migrate or
#: runserver; the worker logs the entry and schedules the others.
MISSING_ID = "pikku_django.W031"  # a workflow or task that cannot be found
CRON_ID = "pikku_django.E032"  # a cron that does not parse
TIMEZONE_ID = "pikku_django.E033"  # an unknown time zone
KEY_ID = "pikku_django.E034"  # an unknown key
VALUE_ID = "pikku_django.E035"  # a bad input, queue, priority or policy

KEYS = frozenset(
    {
        "workflow",
        "task",
        "cron",
        "timezone",
        "input",
        "queue",
        "priority",
        "catch_up",
        "catch_up_window_ms",
        "overlap",
    }
)
DEFAULT_CATCH_UP_WINDOW_MS = 86_400_000
#: The longest cron, workflow name and task path the schedule's columns hold.
MAX_CRON_LENGTH = 255
EXAMPLE = 'PIKKU_SCHEDULES = {"nightly": {"workflow": "report", "cron": "0 2 * * *", "timezone": "UTC"}}'

Problem = tuple[str, str, str]


@dataclass(frozen=True)
class ScheduleEntry:
    """One valid entry, as the ``WorkflowSchedule`` fields it syncs to."""

    workflow: str
    task: str
    cron: str
    timezone: str
    input: Any
    queue: str
    priority: int | None
    catch_up: str
    catch_up_window_ms: int
    overlap: str

    def fields(self) -> dict[str, Any]:
        return asdict(self)


def _target_problems(name: str, entry: dict[str, Any]) -> list[Problem]:
    workflow, task = entry.get("workflow"), entry.get("task")
    hint = "Name a registered @workflow with 'workflow', or a Django Task's dotted path with 'task'."
    if (workflow is None) == (task is None):
        return [(TARGET_ID, f"PIKKU_SCHEDULES[{name!r}] needs exactly one of 'workflow' and 'task'.", hint)]
    if workflow is not None:
        try:
            get_workflow(validate.name("workflow", workflow))
        except WorkflowNotFoundError as e:
            return [(MISSING_ID, f"PIKKU_SCHEDULES[{name!r}]['workflow']: {e}", hint)]
        except InvalidArgumentError as e:
            return [(TARGET_ID, f"PIKKU_SCHEDULES[{name!r}]['workflow']: {e}", hint)]
        return []
    if isinstance(task, str) and len(task) > MAX_CRON_LENGTH:
        message = f"is {len(task)} characters long; at most {MAX_CRON_LENGTH} are stored."
        return [(TARGET_ID, f"PIKKU_SCHEDULES[{name!r}]['task'] {message}", hint)]
    if not HAS_TASKS:
        return [
            (
                TARGET_ID,
                f"PIKKU_SCHEDULES[{name!r}] names a task, but Django's Tasks framework is not installed.",
                "Use Django 6, or install the django-tasks backport (the 'tasks' extra).",
            )
        ]
    try:
        found = resolve_task(task)
        overrides = {
            key: entry[option]
            for option, key in (("queue", "queue_name"), ("priority", "priority"))
            if option in entry
        }
        if overrides:
            found.using(**overrides)
    except TaskPathError as e:
        check_id = MISSING_ID if e.missing else TARGET_ID
        return [(check_id, f"PIKKU_SCHEDULES[{name!r}]['task']: {e}", hint)]
    except Exception as e:  # noqa: BLE001  (any refusal of the task or its options is this problem)
        return [(TARGET_ID, f"PIKKU_SCHEDULES[{name!r}]['task']: {e}", hint)]
    return []


#: The longest catch_up_window_ms: 31 days.
MAX_CATCH_UP_WINDOW_MS = 31 * 86_400_000


def _window(value: object) -> int:
    window = validate.positive_ms("catch_up_window_ms", value)
    if window > MAX_CATCH_UP_WINDOW_MS:
        raise InvalidArgumentError(
            f"catch_up_window_ms must be at most {MAX_CATCH_UP_WINDOW_MS} (31 days), not {window}."
        )
    return window


def _value_problems(name: str, entry: dict[str, Any]) -> list[Problem]:
    checks: dict[str, Callable[[Any], object]] = {
        "input": lambda v: validate.json_value("input", v),
        "queue": lambda v: validate.queue_name("queue", v),
        "priority": lambda v: validate.priority("priority", v),
        "catch_up_window_ms": _window,
    }
    problems: list[Problem] = []
    for key, check in checks.items():
        if key in entry:
            try:
                check(entry[key])
            except InvalidArgumentError as e:
                problems.append(
                    (VALUE_ID, f"PIKKU_SCHEDULES[{name!r}]: {e}", f"Fix {key!r}, or leave it out.")
                )
    if entry.get("task") is not None and "input" in entry and not isinstance(entry["input"], dict):
        problems.append(
            (VALUE_ID, f"PIKKU_SCHEDULES[{name!r}]['input'] must be a dict (the task's kwargs).", EXAMPLE)
        )
    for key, policy in (("catch_up", CatchUp), ("overlap", Overlap)):
        if key in entry and entry[key] not in policy.values:
            problems.append(
                (
                    VALUE_ID,
                    f"PIKKU_SCHEDULES[{name!r}][{key!r}] is {entry[key]!r}, not one of {policy.values}.",
                    f"Set {key!r} to one of {policy.values}, or leave it out for {policy.values[0]!r}.",
                )
            )
    return problems


def problems_of(key: object, entry: object) -> list[Problem]:
    """Everything wrong with one entry (empty when it is valid)."""
    try:
        name = validate.name("schedule name", key)
        if len(str(name)) > MAX_SCHEDULE_NAME_LENGTH:
            raise InvalidArgumentError(f"schedule name is longer than {MAX_SCHEDULE_NAME_LENGTH} characters.")
    except InvalidArgumentError as e:
        return [(SETTING_ID, f"PIKKU_SCHEDULES has a bad schedule name {key!r}: {e}", EXAMPLE)]
    if not isinstance(entry, dict):
        return [
            (SETTING_ID, f"PIKKU_SCHEDULES[{name!r}] must be a dict, not {type(entry).__name__}.", EXAMPLE)
        ]
    problems: list[Problem] = []
    unknown = sorted(set(entry) - KEYS, key=str)
    if unknown:
        problems.append(
            (
                KEY_ID,
                f"PIKKU_SCHEDULES[{name!r}] has unknown keys {unknown}.",
                f"The keys are {sorted(KEYS)}.",
            )
        )
    problems += _target_problems(name, entry)
    try:
        if isinstance(entry.get("cron"), str) and len(entry["cron"]) > MAX_CRON_LENGTH:
            raise InvalidArgumentError(
                f"cron is {len(entry['cron'])} characters long; at most {MAX_CRON_LENGTH} are stored."
            )
        cron.parse(entry.get("cron"))
    except InvalidArgumentError as e:
        problems.append(
            (CRON_ID, f"PIKKU_SCHEDULES[{name!r}]['cron']: {e}", "Give five fields, e.g. '0 2 * * *'.")
        )
    try:
        cron.zone(entry.get("timezone", "UTC"))
    except InvalidArgumentError as e:
        problems.append(
            (
                TIMEZONE_ID,
                f"PIKKU_SCHEDULES[{name!r}]['timezone']: {e}",
                "Use an IANA name, e.g. 'Europe/Helsinki'.",
            )
        )
    return problems + _value_problems(name, entry)


def read() -> tuple[dict[str, ScheduleEntry], dict[str, list[Problem]]]:
    """The valid entries of ``PIKKU_SCHEDULES`` by name, and the problems of the others."""
    value = conf.SCHEDULES
    if not isinstance(value, dict):
        problem = (SETTING_ID, f"PIKKU_SCHEDULES must be a dict, not {type(value).__name__}.", EXAMPLE)
        return {}, {"": [problem]}
    entries: dict[str, ScheduleEntry] = {}
    bad: dict[str, list[Problem]] = {}
    for name, entry in value.items():
        problems = problems_of(name, entry)
        if problems:
            bad[str(name)] = problems
            continue
        entries[name] = ScheduleEntry(
            workflow=entry.get("workflow") or "",
            task=entry.get("task") or "",
            cron=entry["cron"],
            timezone=entry.get("timezone", "UTC"),
            # As stored and read back, so that a comparison with the row is exact.
            input=json.loads(json.dumps(entry.get("input"))),
            queue=entry.get("queue", ""),
            priority=entry.get("priority"),
            catch_up=entry.get("catch_up", CatchUp.LATEST.value),
            catch_up_window_ms=entry.get("catch_up_window_ms", DEFAULT_CATCH_UP_WINDOW_MS),
            overlap=entry.get("overlap", Overlap.ALLOW.value),
        )
    return entries, bad


def fingerprint(entries: dict[str, ScheduleEntry]) -> str:
    return json.dumps({name: entry.fields() for name, entry in entries.items()}, sort_keys=True)
