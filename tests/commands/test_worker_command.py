"""
``manage.py pikku_worker`` as a command: its options are checked before it
starts (exit 2 with the usage, naming the option), ``--once`` and
``--max-runs`` end it, and verbosity 0 keeps stdout silent.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing.models import PassRecord, StepCall
from tests.support.children import ROOT, kill_all, subprocess_env
from tests.support.command_line import from_the_command_line

pytestmark = pytest.mark.slow

#: Bad options, and how argparse names each one in its error.
BAD_OPTIONS = [
    (["--interval", "0"], "argument --interval: '0' must be > 0 and at most 86400 seconds"),
    (["--interval", "abc"], "argument --interval: 'abc' is not a number of seconds"),
    (["--interval", "nan"], "argument --interval: 'nan' must be between 0 and 1000000000 seconds"),
    (["--batch", "0"], "argument --batch: '0' must be >= 1"),
    (["--max-runs", "-1"], "argument --max-runs: '-1' must be >= 1"),
    (["--max-runs", "1.5"], "argument --max-runs: '1.5' is not a whole number"),
    (["--holder", ""], "argument --holder: holder must not be empty."),
]


class WorkerCommandTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def tearDown(self) -> None:
        kill_all(self.procs)

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "pikku_worker", *args],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def run_worker(self, *args: str, timeout: float = 60) -> tuple[int, str, str, float]:
        """Run the command to its end: exit code, stdout, stderr, seconds taken."""
        started = time.monotonic()
        proc = self.start(*args)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - started

    def test_bad_options_exit_2_with_the_usage_naming_the_option(self) -> None:
        # One in a process of its own; each of them through manage.py's own
        # entry point in this one (a process start-up costs most of a second).
        args, message = BAD_OPTIONS[0]
        proc = self.start(*args, "--once")
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (2, ""), err
        assert err.startswith("usage: manage.py pikku_worker "), err
        assert f"manage.py pikku_worker: error: {message}\n" in err, err
        for args, message in BAD_OPTIONS:
            with self.subTest(args=args):
                code, out, err = from_the_command_line("pikku_worker", *args, "--once")
                assert (code, out) == (2, ""), (args, err)
                assert err.startswith("usage: manage.py pikku_worker "), (args, err)
                assert f"manage.py pikku_worker: error: {message}\n" in err, (args, err)

    def test_bad_options_raise_command_error_through_call_command(self) -> None:
        # Should an option be accepted after all, never let the worker run (and
        # take over SIGTERM/SIGINT) inside the test process.
        with (
            mock.patch.object(Worker, "install_signal_handlers"),
            mock.patch.object(Worker, "run", return_value=0),
        ):
            for args, message in BAD_OPTIONS:
                with (
                    self.subTest(args=args),
                    pytest.raises(CommandError, match=f"^Error: {re.escape(message)}"),
                ):
                    call_command("pikku_worker", *args, "--once")

    def test_interval_too_long_to_wait_is_refused(self) -> None:
        # float() takes these, but threading.Event.wait() raises OverflowError
        # on them once the worker is idle: refuse them like any bad interval.
        procs = [(value, self.start("--interval", value)) for value in ("inf", "1e300")]
        for value, proc in procs:
            out, err = proc.communicate(timeout=60)
            assert "OverflowError" not in err, (value, err)
            assert proc.returncode == 2, (value, proc.returncode, err)
            assert "argument --interval" in err, (value, err)

    def test_once_on_an_empty_database_exits_zero_at_once(self) -> None:
        # An interval of 10 minutes: --once must not wait it out.
        code, out, err, took = self.run_worker("--once", "--interval", "600", "--holder", "empty")
        assert code == 0, err
        assert out == "pikku_worker empty ready\npikku_worker empty stopped after 0 passes\n"
        assert err == ""
        print(f"\n--once on an empty database: exited 0 in {took:.2f} s (interval 600 s)")  # noqa: T201

    def test_max_runs_one_drives_exactly_one_pass(self) -> None:
        runs = [start_workflow("test.steps", {"steps": 1}) for _ in range(2)]
        # No --once: only --max-runs ends this worker (or the timeout fails the test).
        code, out, err, _ = self.run_worker("--max-runs", "1", "--interval", "600", "--holder", "one")
        assert code == 0, err
        assert out == "pikku_worker one ready\npikku_worker one stopped after 1 passes\n"
        statuses = sorted(
            WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)
        )
        assert statuses == ["completed", "running"]
        assert PassRecord.objects.count() == 1
        assert StepCall.objects.count() == 1
        # The other run was not taken: it is still due now.
        left = WorkflowRun.objects.get(status="running")
        assert WorkflowRun.objects.due().filter(pk=left.pk).exists()

    def test_verbosity_zero_prints_nothing(self) -> None:
        run = start_workflow("test.steps", {"steps": 2})
        code, out, err, _ = self.run_worker("--once", "--verbosity", "0")
        assert code == 0, err
        assert (out, err) == ("", "")
        run.refresh_from_db()
        assert run.status == "completed"

    def test_verbosity_two_logs_each_pass_on_stderr_only(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        code, out, err, _ = self.run_worker("--once", "--verbosity", "2", "--holder", "chatty")
        assert code == 0, err
        assert out == "pikku_worker chatty ready\npikku_worker chatty stopped after 1 passes\n"
        assert f"Run {run.pk} (test.steps): completed" in err
        assert "Worker chatty stopped after 1 passes." in err
