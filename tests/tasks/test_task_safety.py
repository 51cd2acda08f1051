"""
What a task may do, and what the backend refuses: ``SystemExit`` and
``KeyboardInterrupt`` are a task's own errors, arguments that are not JSON
are a ``TypeError``, every lost attempt names its worker, bad OPTIONS are
check messages, enqueue and get_result send few statements, a stored path
imports nothing arbitrary, and only the backend starts task runs.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import F
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.errors import (
    InvalidArgumentError,
    PikkuError,
    StepLeaseExpiredError,
    TaskArgumentsError,
    TaskPathError,
)
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from pikku_django.sweep import sweep
from pikku_django.tasks import PikkuTaskBackend
from pikku_django.tasks.backend import NOT_INSTALLED_CHECK_ID, OPTIONS_CHECK_ID
from pikku_django.tasks.compat import TaskResultStatus, task_backends
from pikku_django.tasks.results import TASK_WORKFLOW, resolve_task
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing import tasks
from tests.support.children import ROOT, subprocess_env
from tests.support.factories import lapse_step


def drain(holder: str = "w-1") -> int:
    return Worker(holder=holder, once=True, interval=0.01).run()


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def result_of(result_id: str) -> Any:
    return task_backends["default"].get_result(result_id)


class BaseExceptionTests(TransactionTestCase):
    def test_sys_exit_and_keyboard_interrupt_are_the_tasks_errors_and_the_worker_goes_on(self) -> None:
        exited = tasks.exits.enqueue(3)
        interrupted = tasks.interrupts.enqueue()
        after = tasks.add.enqueue(1, 2)
        assert drain() == 3
        exited, interrupted, after = result_of(exited.id), result_of(interrupted.id), result_of(after.id)
        assert exited.status == TaskResultStatus.FAILED
        ((error,),) = [exited.errors]
        assert error.exception_class is SystemExit
        assert "SystemExit: 3" in error.traceback and "sys.exit(code)" in error.traceback
        assert interrupted.status == TaskResultStatus.FAILED
        assert [e.exception_class_path for e in interrupted.errors] == ["builtins.KeyboardInterrupt"]
        assert "KeyboardInterrupt: from the task" in interrupted.errors[0].traceback
        assert (after.status, after.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
        step = WorkflowStep.objects.get(run_id=exited.id)
        assert (step.status, step.error["type"], step.error["message"]) == (
            "failed",
            "builtins.SystemExit",
            "3",
        )

    def test_each_attempt_that_exits_is_one_failed_attempt(self) -> None:
        result = tasks.exits_every_attempt.enqueue()
        drain("w-exit")
        result = tasks.exits_every_attempt.get_result(result.id)
        assert result.status == TaskResultStatus.FAILED
        assert (result.attempts, result.worker_ids) == (3, ["w-exit"] * 3)
        assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"] * 3


class ArgumentTests(TransactionTestCase):
    def test_arguments_that_are_not_json_are_a_type_error_and_a_pikku_error(self) -> None:
        bad: list[tuple[list[Any], dict[str, Any]]] = [
            ([object()], {}),
            ([], {"when": {1, 2}}),
            ([b"\xff"], {}),
            ([float("nan")], {}),
        ]
        for args, kwargs in bad:
            with self.assertNumQueries(0), pytest.raises(TypeError) as caught:
                tasks.note.enqueue(*args, **kwargs)
            assert isinstance(caught.value, TaskArgumentsError)
            assert isinstance(caught.value, PikkuError) and isinstance(caught.value, InvalidArgumentError)
            assert "JSON" in str(caught.value)
        assert not WorkflowRun.objects.exists()


class LostWorkerTests(TransactionTestCase):
    def test_every_lost_attempt_is_a_worker_lost_error_naming_its_worker_the_last_too(self) -> None:
        result = tasks.block_first_attempt.enqueue()  # retries 2: three attempts
        step = WorkflowStep.objects.get(run_id=result.id)
        for holder in ["w-a", "w-b", "w-c"]:
            assert WorkflowStep.objects.claim(step.run_id, "task", step.rpc_name, 60_000, holder=holder)
            lapse_step(step)
        drain("w-sweeper")
        done = tasks.block_first_attempt.get_result(result.id)
        assert done.status == TaskResultStatus.FAILED
        assert done.worker_ids == ["w-a", "w-b", "w-c"]
        assert [e.exception_class_path for e in done.errors] == ["pikku_django.errors.WorkerLostError"] * 3
        for error, holder in zip(done.errors, ["w-a", "w-b", "w-c"], strict=True):
            assert holder in error.traceback
            assert issubclass(error.exception_class, StepLeaseExpiredError)
        assert "taken again" in done.errors[0].traceback and "last attempt" in done.errors[2].traceback


class CheckTests(TransactionTestCase):
    def test_bad_options_are_check_messages_not_errors_while_the_backend_loads(self) -> None:
        bad: list[Any] = [{"retries": -1}, {"retries": 2**40}, {"lease_ms": 0}, {"retry": 1}, ["retries"]]
        for options in bad:
            backend = PikkuTaskBackend("broken", {"OPTIONS": options})
            (message,) = backend.check()
            assert message.id == OPTIONS_CHECK_ID and message.is_serious()
            assert "TASKS['broken']['OPTIONS']" in message.msg and message.hint
        assert list(task_backends["default"].check()) == []

    def test_pikku_django_missing_from_installed_apps_is_reported_with_a_hint(self) -> None:
        from django.apps import apps

        backend = PikkuTaskBackend("tasks", {})
        installed = [app.name for app in apps.get_app_configs() if app.name != "pikku_django"]
        apps.set_installed_apps(installed)
        try:
            messages = list(backend.check())
        finally:
            apps.unset_installed_apps()
        (message,) = messages
        assert message.id == NOT_INSTALLED_CHECK_ID and "INSTALLED_APPS" in message.msg
        assert "Add 'pikku_django' to INSTALLED_APPS" in str(message.hint)


class CheckCommandTests(TransactionTestCase):
    def test_manage_py_check_reports_bad_options_and_never_crashes(self) -> None:
        env = subprocess_env(PIKKU_TASK_OPTIONS='{"retries": -1, "lease": 5}')
        done = subprocess.run(
            [sys.executable, "manage.py", "check"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        assert "pikku_django.E021" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert "TASKS['default']['OPTIONS']: unknown options ['lease']." in done.stderr
        assert "HINT: PikkuTaskBackend reads OPTIONS" in done.stderr


class StatementTests(TransactionTestCase):
    def test_enqueue_reads_nothing_back_and_opens_no_savepoint(self) -> None:
        with CaptureQueriesContext(connection) as enqueued:
            result = tasks.add.enqueue(1, 2)
        # PostgreSQL's one NOTIFY is the wake-up of idle workers (pikku_django.wakeups).
        notified = [q["sql"] for q in enqueued.captured_queries if q["sql"].startswith("NOTIFY")]
        assert len(notified) == (1 if connection.vendor == "postgresql" else 0), notified
        statements = [q["sql"] for q in enqueued.captured_queries if not q["sql"].startswith("NOTIFY")]
        assert len(statements) <= 3, statements
        assert not [s for s in statements if "SAVEPOINT" in s.upper()], statements
        if connection.vendor == "sqlite":
            assert [s.split()[0] for s in statements] == ["INSERT", "INSERT"], statements
        with CaptureQueriesContext(connection) as read:
            fetched = result_of(result.id)
        assert len(read.captured_queries) <= 2, read.captured_queries
        assert fetched.status == TaskResultStatus.READY
        assert fetched.enqueued_at == result.enqueued_at == WorkflowRun.objects.get(pk=result.id).created_at
        drain()
        with CaptureQueriesContext(connection) as read:
            fetched = result_of(result.id)
        assert len(read.captured_queries) <= 2, read.captured_queries
        assert (fetched.return_value, fetched.worker_ids) == (3, ["w-1"])


class EnqueueRaceTests(TransactionTestCase):
    def test_a_worker_that_takes_the_run_before_its_step_is_stored_is_no_error(self) -> None:
        """
        In autocommit the run is due once its INSERT commits. A worker (on its
        own connection, in a thread) takes it and inserts the step itself just
        before enqueue's own step INSERT: enqueue returns the task, run once.
        """
        staged: list[int] = []

        def worker_first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if not staged and sql.startswith("INSERT") and WorkflowStep._meta.db_table in sql:
                staged.append(1)
                thread = threading.Thread(target=lambda: (drain("racer"), connections.close_all()))
                thread.start()
                thread.join(timeout=60)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(worker_first):
            result = tasks.add.enqueue(2, 3)
        assert staged
        fetched = result_of(result.id)
        assert (fetched.status, fetched.return_value, fetched.worker_ids) == (
            TaskResultStatus.SUCCESSFUL,
            5,
            ["racer"],
        )
        assert WorkflowStep.objects.filter(run_id=result.id).count() == 1


class DeferredTests(TransactionTestCase):
    def test_a_deferred_task_is_never_woken_early_by_the_sweep(self) -> None:
        later = datetime.datetime.fromtimestamp(now_ms() / 1000 + 3600, tz=datetime.timezone.utc)
        result = tasks.add.using(run_after=later).enqueue(1, 2)
        # Idle far past the stalled and undispatched windows.
        ago = datetime.timedelta(minutes=30)
        WorkflowRun.objects.filter(pk=result.id).update(updated_at=F("updated_at") - ago)
        WorkflowStep.objects.filter(run_id=result.id).update(updated_at=F("updated_at") - ago)
        report = sweep(stalled_after_ms=60_000)
        assert (report.stalled_runs, report.undispatched_runs, report.woken_runs) == (0, 0, 0)
        assert drain() == 0 and result_of(result.id).status == TaskResultStatus.READY
        # Once due on the database clock, a worker runs it.
        WorkflowRun.objects.filter(pk=result.id).update(wake_at=now_ms())
        assert drain() == 1 and result_of(result.id).return_value == 3


#: A module that is no installed app's, and writes its marker file when imported.
EVIL = """
from pathlib import Path
Path({marker!r}).write_text("imported")
thing = 1
"""


class PathTests(TransactionTestCase):
    def test_a_stored_path_outside_the_known_tasks_is_refused_without_importing_it(self) -> None:
        tmp = Path(f"/tmp/pikku-path-{uuid.uuid4().hex}")  # noqa: S108
        tmp.mkdir()
        marker = tmp / "marker"
        name = f"pikku_evil_{uuid.uuid4().hex}"
        (tmp / f"{name}.py").write_text(EVIL.format(marker=str(marker)))
        sys.path.insert(0, str(tmp))
        try:
            with pytest.raises(TaskPathError, match="is not imported, and is in no installed app"):
                resolve_task(f"{name}.thing")
            assert not marker.exists() and name not in sys.modules
            # A stored run naming it fails, and still imports nothing.
            run = WorkflowRun.objects.create_run(
                TASK_WORKFLOW,
                {"task": f"{name}.thing", "backend": "default", "args": [], "kwargs": {}, "retries": 0},
                internal=True,
            )
            drain()
            run.refresh_from_db()
            assert (run.status, run.error["type"]) == ("failed", "pikku_django.errors.TaskPathError")
            assert not marker.exists() and name not in sys.modules
        finally:
            sys.path.remove(str(tmp))
        # A Task of an installed app is found (imported if need be).
        assert resolve_task("testproject.testing.tasks.add") is tasks.add

    def test_only_the_backend_starts_runs_of_the_task_workflow(self) -> None:
        stored = {"task": "testproject.testing.tasks.add", "backend": "default", "args": [1, 2], "kwargs": {}}
        with pytest.raises(InvalidArgumentError, match="only its backend starts runs"):
            start_workflow(TASK_WORKFLOW, {**stored, "retries": 0})
        with pytest.raises(InvalidArgumentError, match="only its backend starts runs"):
            start_workflow(TASK_WORKFLOW, {**stored, "retries": 0}, idempotency_key="k")
        with pytest.raises(InvalidArgumentError, match="only its backend starts runs"):
            WorkflowRun.objects.create_run(TASK_WORKFLOW, stored)
        assert not WorkflowRun.objects.exists()
