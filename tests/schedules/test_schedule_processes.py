"""
Schedules under real processes on the live test database: five schedulers
at once record each tick once, SIGKILLed schedulers leave every tick either
recorded with its run or not at all, a scheduler whose clock runs two hours
fast records nothing early, and a task tick reaches SUCCESSFUL through
``pikku_worker``.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
from typing import Any
from unittest import skipIf

import pytest
from django.db import connection
from django.test import override_settings

from pikku_django.models import WorkflowRun, WorkflowSchedule, WorkflowScheduleTick
from pikku_django.schedules import tick
from pikku_django.tasks.compat import TaskResultStatus, task_backends
from tests.support.children import poll_until, read_line, send_line, start_script, subprocess_env
from tests.support.processes import ProcessTestCase
from tests.support.schedules import HOUR_MS, MINUTE_MS, age, db_now_ms, hourly_away

pytestmark = pytest.mark.slow

#: ``python -c TICKER passes [inside]``: says "ready", waits for "go", runs
#: ``tick()`` ``passes`` times, then prints what it recorded. With ``inside``,
#: it says "inside" once a pass has started that many runs (its transaction
#: still open), so a kill can land there.
TICKER = """
import json, sys, time
import django
django.setup()
from pikku_django.schedules import ledger as schedules
from pikku_django.models import Lease
from pikku_django.schedules import tick
if len(sys.argv) > 2:
    started, start = [0], schedules._start
    def counting(*args):
        start(*args)
        started[0] += 1
        if started[0] == int(sys.argv[2]):
            print("inside", flush=True)
    schedules._start = counting
clocks = {"own_ms": int(time.time() * 1000), "db_ms": Lease.objects.db_now_ms()}
print("ready", json.dumps(clocks), flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(1)
recorded = []
for _ in range(int(sys.argv[1])):
    recorded += [[row.schedule_id, row.tick_at, row.skipped] for row in tick()]
print(json.dumps(recorded), flush=True)
"""


def minutes(name: str, **options: Any) -> dict[str, Any]:
    return {name: {"workflow": "test.scheduled", "cron": "* * * * *", **options}}


class TickerTestCase(ProcessTestCase):
    """Starts TICKER processes and checks the ledger they leave."""

    def tickers(
        self, n: int, passes: int, setting: dict[str, Any], prefix: list[str] | None = None, *args: str
    ) -> list[Any]:
        env = subprocess_env(PIKKU_SCHEDULES=json.dumps(setting))
        procs = [start_script(TICKER, str(passes), *args, env=env, prefix=prefix) for _ in range(n)]
        self.procs += procs
        self.ready = [json.loads(read_line(proc, timeout=60).split(" ", 1)[1]) for proc in procs]
        return procs

    def results(self, procs: list[subprocess.Popen[str]]) -> list[list[Any]]:
        out = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr
            assert "Traceback" not in stderr, stderr
            out += json.loads(stdout.splitlines()[-1])
        return out

    def assert_ledger(self, name: str, last: int) -> list[WorkflowScheduleTick]:
        """Each minute from ``last`` to the newest recorded once, and each started tick with its one run."""
        rows = list(WorkflowScheduleTick.objects.filter(schedule__name=name).order_by("tick_at"))
        at = [row.tick_at for row in rows]
        assert at[0] == last and at == list(range(last, at[-1] + 1, MINUTE_MS)), at
        started = {row.run_id: row.tick_at for row in rows[1:] if row.skipped == ""}
        runs = dict(
            WorkflowRun.objects.filter(idempotency_key__startswith=f"schedule:{name}:").values_list(
                "pk", "idempotency_key"
            )
        )
        assert runs == {pk: f"schedule:{name}:{tick_at}" for pk, tick_at in started.items()}
        return rows[1:]


class SchedulerProcessTests(TickerTestCase):
    def test_five_schedulers_record_each_tick_once(self) -> None:
        setting = {
            **minutes("latest"),
            **minutes("all", catch_up="all"),
            **minutes("skip", catch_up="all", overlap="skip"),
        }
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
        last = db_now_ms() // MINUTE_MS * MINUTE_MS - 5 * MINUTE_MS
        for name in setting:
            age(name, last)
        start = db_now_ms()
        procs = self.tickers(5, 20, setting)
        for proc in procs:
            send_line(proc, "go")
        recorded = self.results(procs)
        ids = dict(WorkflowSchedule.objects.values_list("name", "pk"))
        for name in setting:
            rows = self.assert_ledger(name, last)
            assert rows[-1].tick_at >= start // MINUTE_MS * MINUTE_MS
            # What the processes say they recorded is the ledger, each row once.
            mine = sorted(tick_at for schedule, tick_at, _ in recorded if schedule == ids[name])
            assert mine == [row.tick_at for row in rows]
            skipped = [row.skipped for row in rows]
            if name == "latest":
                # The missed ticks but the newest are skipped: one catch-up run, then the on-time ones.
                first_run = skipped.index("")
                assert first_run >= 3 and set(skipped[:first_run]) == {"catch_up"}
                assert set(skipped[first_run:]) == {""}
            elif name == "all":
                assert set(skipped) == {""}
            else:
                assert skipped[0] == "" and set(skipped[1:]) == {"overlap"}

    def test_killed_schedulers_leave_each_tick_whole(self) -> None:
        # Six hours of minutes to catch up: one pass records 360 ticks and
        # starts 360 runs in one transaction, long enough to be killed inside.
        setting = minutes("big", catch_up="all")
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
        last = db_now_ms() // MINUTE_MS * MINUTE_MS - 6 * HOUR_MS
        age("big", last)
        rng = random.Random(16)
        for _ in range(3):
            (proc,) = self.tickers(1, 1, setting, None, str(rng.randint(1, 300)))
            send_line(proc, "go")
            assert read_line(proc, timeout=60) == "inside\n"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL
            # Killed inside its transaction: no tick recorded, no run started.
            assert WorkflowScheduleTick.objects.filter(schedule__name="big").count() == 1
            assert not WorkflowRun.objects.exists()
        procs = self.tickers(2, 3, setting)
        for proc in procs:
            send_line(proc, "go")
        self.results(procs)
        rows = self.assert_ledger("big", last)
        assert len(rows) >= 360 and {row.skipped for row in rows} == {""}


@skipIf(
    connection.vendor == "sqlite",
    "on SQLite the database clock is the process clock by design (one host), so faketime moves it too",
)
class SkewedSchedulerTests(TickerTestCase):
    def test_a_fast_clock_records_nothing_early(self) -> None:
        cron, past = hourly_away(30)
        setting = {
            "later": {"workflow": "test.scheduled", "cron": cron},
            "due": {"workflow": "test.scheduled", "cron": cron},
        }
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
        age("later", past)
        age("due", past - HOUR_MS)
        (proc,) = self.tickers(1, 3, setting, prefix=["faketime", "-f", "+2h"])
        (clocks,) = self.ready
        assert clocks["own_ms"] - clocks["db_ms"] > 1.5 * HOUR_MS, clocks
        send_line(proc, "go")
        recorded = self.results([proc])
        # By its own clock "later" has two ticks due and "due" three; on the
        # database clock, only "due" has one.
        due = WorkflowSchedule.objects.get(name="due").pk
        assert [(schedule, tick_at) for schedule, tick_at, _ in recorded] == [(due, past)]
        assert WorkflowScheduleTick.objects.filter(schedule__name="later").count() == 1


class ScheduledTaskTests(ProcessTestCase):
    def test_a_task_tick_reaches_successful_through_pikku_worker(self) -> None:
        cron, past = hourly_away()
        setting = {
            "adder": {"task": "testproject.testing.tasks.add", "cron": cron, "input": {"a": 2, "b": 3}}
        }
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
            age("adder", past - HOUR_MS)
            (row,) = tick()
        assert row.run_id is None and row.task_result_id
        proc = self.command("pikku_worker", "--once", "--holder", "sched-worker")
        code, _ = self.exits(proc, timeout=60)
        assert code == 0, self.log(proc)
        result = task_backends["default"].get_result(row.task_result_id)
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


class WorkerSchedulerTests(TickerTestCase):
    def test_workers_killed_while_they_schedule_leave_each_tick_once(self) -> None:
        setting = minutes("in-workers", catch_up="all")
        with override_settings(PIKKU_SCHEDULES=setting):
            tick()
        last = db_now_ms() // MINUTE_MS * MINUTE_MS - 30 * MINUTE_MS
        age("in-workers", last)
        env = subprocess_env(PIKKU_SCHEDULES=json.dumps(setting))
        workers = [
            self.worker(f"sched-{i}", "--concurrency", "2", "--interval", "0.05", env=env) for i in range(4)
        ]
        # Two die as soon as anything is recorded, wherever they are in their passes.
        poll_until(lambda: WorkflowScheduleTick.objects.filter(schedule__name="in-workers").count() > 1, 60)
        for victim in workers[:2]:
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=10) == -signal.SIGKILL
        for i, survivor in enumerate(workers[2:], start=2):
            self.stop(survivor, f"sched-{i}")
        # A clean worker records whatever is left (its --once makes one scheduler pass).
        once = self.command("pikku_worker", "--once", "--holder", "sched-last", env=env)
        assert self.exits(once, timeout=60)[0] == 0, self.log(once)
        rows = self.assert_ledger("in-workers", last)
        assert len(rows) >= 30 and all(row.skipped == "" for row in rows)
