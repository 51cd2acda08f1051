"""
Django Tasks run by real ``manage.py pikku_worker`` processes on the live test
database: results, a worker SIGKILLed inside a task (right after the take
that claimed its step, issue 14) and one paused past its leases, several
processes of several lanes draining tasks, ``run_after`` judged on the
database clock, priorities, queues, and a queue's global concurrency (slot
leases) across worker processes, including a SIGKILLed slot holder.
"""

from __future__ import annotations

import datetime
import json
import random
import signal
import subprocess
import sys
from unittest import skipIf

import pytest
from django.db import connection
from django.utils import timezone

from pikku_django.errors import StepLeaseExpiredError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.tasks.compat import TaskResultStatus, task_backends
from testproject.testing import tasks
from testproject.testing.models import PassRecord, StepCall
from tests.support.children import ROOT, poll_until, subprocess_env
from tests.support.processes import rows_of
from tests.support.workers import WorkerProcessTestCase

pytestmark = pytest.mark.slow

SHORT_LEASES = {"PIKKU_LEASE_TTL_MS": "1500", "PIKKU_STEP_LEASE_MS": "1500"}


def result_of(result_id: str):  # type: ignore[no-untyped-def]
    return task_backends["default"].get_result(result_id)


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """The most intervals [start, end) open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = peak = 0
    for _, change in events:
        open_now += change
        peak = max(peak, open_now)
    return peak


class TaskWorkerTests(WorkerProcessTestCase):
    def test_enqueue_then_worker_once(self) -> None:
        ok = tasks.add.enqueue(20, 22)
        bad = tasks.explode.enqueue("kaput")
        retried = tasks.flaky.enqueue(succeed_on=99)
        out = self.once("proc-1")
        assert out.endswith("stopped after 3 passes\n"), out
        ok, bad, retried = result_of(ok.id), result_of(bad.id), result_of(retried.id)
        assert (ok.status, ok.return_value, ok.worker_ids) == (TaskResultStatus.SUCCESSFUL, 42, ["proc-1"])
        assert bad.status == TaskResultStatus.FAILED
        assert [e.exception_class_path for e in bad.errors] == ["builtins.ValueError"]
        assert "ValueError: kaput" in bad.errors[0].traceback
        assert retried.status == TaskResultStatus.FAILED
        assert (retried.attempts, retried.worker_ids) == (3, ["proc-1"] * 3)
        assert len(retried.errors) == 3

    def test_worker_killed_inside_a_task_is_replaced_by_attempt_two(self) -> None:
        env = subprocess_env(**SHORT_LEASES)
        result = tasks.block_first_attempt.enqueue()
        a = self.worker("--holder", "worker-a", "--interval", "0.1", env=env)
        self.ready(a, "worker-a")
        poll_until(lambda: StepCall.objects.filter(run_id=result.id).exists(), timeout=60)
        assert result_of(result.id).status == TaskResultStatus.RUNNING
        a.send_signal(signal.SIGKILL)
        assert a.wait(timeout=10) == -signal.SIGKILL

        b = self.worker("--holder", "worker-b", "--interval", "0.1", env=env)
        self.ready(b, "worker-b")
        done = poll_until(lambda: (r := result_of(result.id)).is_finished and r, timeout=60, interval=0.05)
        assert done.status == TaskResultStatus.SUCCESSFUL, done.errors
        assert done.return_value == "done"
        assert (done.attempts, done.worker_ids) == (2, ["worker-a", "worker-b"])
        ((lost,),) = [done.errors]
        assert lost.exception_class_path == "pikku_django.errors.WorkerLostError"
        assert "worker-a" in lost.traceback
        assert list(
            StepCall.objects.filter(run_id=result.id).order_by("at_ms", "pk").values_list("step", "pid")
        ) == [
            ("attempt 1", a.pid),
            ("attempt 2", b.pid),
        ]
        self.stop(b, "worker-b")

    def test_higher_priorities_first(self) -> None:
        priorities = random.Random(11).sample(range(-100, 101), 20)
        results = {tasks.note.using(priority=p).enqueue(str(p)).id: p for p in priorities}
        self.once("proc-p", env=subprocess_env())
        order = list(StepCall.objects.order_by("at_ms", "pk").values_list("step", flat=True))
        assert order == [str(p) for p in sorted(priorities, reverse=True)]
        assert all(result_of(i).status == TaskResultStatus.SUCCESSFUL for i in results)

    def test_a_worker_on_queue_a_never_takes_queue_b(self) -> None:
        a = [tasks.note.using(queue_name="a").enqueue(f"a{i}") for i in range(3)]
        b = [tasks.note.using(queue_name="b", priority=100).enqueue(f"b{i}") for i in range(3)]
        proc = self.worker("--once", "--holder", "proc-a", "--queue", "a")
        code, _ = self.exits(proc, timeout=60)
        assert code == 0, self.log(proc)
        assert {result_of(r.id).status for r in a} == {TaskResultStatus.SUCCESSFUL}
        assert {result_of(r.id).status for r in b} == {TaskResultStatus.READY}
        assert not StepCall.objects.filter(step__startswith="b").exists()


class TaskExitTests(WorkerProcessTestCase):
    def test_a_task_calling_sys_exit_is_failed_and_the_worker_goes_on_and_exits_0(self) -> None:
        exiting = tasks.exits_every_attempt.enqueue()  # retries 2: three attempts
        interrupted = tasks.interrupts.using(priority=-1).enqueue()
        after = tasks.add.using(priority=-2).enqueue(20, 22)
        out = self.once("proc-exit")
        assert out.endswith("stopped after 3 passes\n"), out
        exiting = tasks.exits_every_attempt.get_result(exiting.id)
        assert exiting.status == TaskResultStatus.FAILED
        assert (exiting.attempts, exiting.worker_ids) == (3, ["proc-exit"] * 3)
        assert [e.exception_class_path for e in exiting.errors] == ["builtins.SystemExit"] * 3
        assert list(StepCall.objects.filter(run_id=exiting.id).values_list("step", flat=True)) == [
            "attempt 1",
            "attempt 2",
            "attempt 3",
        ]
        assert [e.exception_class_path for e in result_of(interrupted.id).errors] == [
            "builtins.KeyboardInterrupt"
        ]
        assert result_of(after.id).return_value == 42


@skipIf(
    connection.vendor == "sqlite",
    "on SQLite the database clock is the process clock by design (one host), so faketime moves it too",
)
class RunAfterClockTests(WorkerProcessTestCase):
    def test_run_after_is_judged_on_the_database_clock(self) -> None:
        db_now = Lease.objects.db_now_ms()
        later = datetime.datetime.fromtimestamp(db_now / 1000 + 3600, tz=datetime.timezone.utc)
        result = tasks.add.using(run_after=later).enqueue(1, 2)
        # A worker whose clock runs two hours fast: the task is an hour from
        # due on the database clock, so it leaves it alone.
        proc = subprocess.Popen(
            [
                "faketime",
                "-f",
                "+2h",
                sys.executable,
                "manage.py",
                "pikku_worker",
                "--once",
                "--holder",
                "fast",
            ],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.endswith("stopped after 0 passes\n"), out
        fetched = result_of(result.id)
        assert (fetched.status, fetched.attempts) == (TaskResultStatus.READY, 0)
        # Once it is due on the database clock, any worker runs it.
        WorkflowRun.objects.filter(pk=result.id).update(wake_at=Lease.objects.db_now_ms())
        self.once("on-time")
        assert result_of(result.id).return_value == 3


class ConcurrencyTests(WorkerProcessTestCase):
    def test_four_workers_never_run_more_than_two_slow_tasks_at_once(self) -> None:
        env = subprocess_env(PIKKU_QUEUES=json.dumps({"slow": {"concurrency": 2}}))
        results = [tasks.slow.using(queue_name="slow").enqueue(400) for _ in range(8)]
        holders = [f"worker-{i}" for i in range(4)]
        procs = [self.worker("--holder", h, "--interval", "0.05", env=env) for h in holders]
        for proc, holder in zip(procs, holders, strict=True):
            self.ready(proc, holder)
        poll_until(lambda: all(result_of(r.id).is_finished for r in results), timeout=120, interval=0.1)
        assert {result_of(r.id).status for r in results} == {TaskResultStatus.SUCCESSFUL}
        records = list(PassRecord.objects.values_list("start_ms", "end_ms", "pid"))
        assert len(records) == 8
        peak = max_overlap([(s, e) for s, e, _ in records])
        print(f"\nslow tasks running at once (DB clock): at most {peak}")  # noqa: T201
        assert peak <= 2, records
        for proc, holder in zip(procs, holders, strict=True):
            self.stop(proc, holder)

    def test_a_sigkilled_slot_holders_slot_frees_when_its_lease_lapses(self) -> None:
        env = subprocess_env(PIKKU_QUEUES=json.dumps({"slow": {"concurrency": 1}}), **SHORT_LEASES)
        # It blocks only the first worker that runs it: the next one, which
        # takes it again once its slot frees, ends it.
        blocked = tasks.block_first_without_losses.using(queue_name="slow").enqueue()
        k = self.worker("--holder", "worker-k", "--interval", "0.1", env=env)
        self.ready(k, "worker-k")
        poll_until(lambda: StepCall.objects.filter(run_id=blocked.id).exists(), timeout=60)
        slot = Lease.objects.current("queue:slow:0")
        assert slot is not None and slot.holder == "worker-k"
        k.send_signal(signal.SIGKILL)
        assert k.wait(timeout=10) == -signal.SIGKILL
        # The dead worker's slot stays taken until its lease lapses, then frees itself.
        last_expiry = Lease.objects.get(key="queue:slow:0").expires_at
        after = tasks.note.using(queue_name="slow", priority=5).enqueue("after")
        l_proc = self.worker("--holder", "worker-l", "--interval", "0.1", env=env)
        self.ready(l_proc, "worker-l")
        poll_until(lambda: result_of(after.id).is_finished, timeout=60, interval=0.05)
        ran_at = StepCall.objects.get(run_id=after.id).at_ms
        assert ran_at >= last_expiry, (ran_at, last_expiry)
        holders = list(
            WorkflowRun.objects.filter(pk=after.id).values_list("steps__attempts__holder", flat=True)
        )
        assert holders == ["worker-l"]
        self.stop(l_proc, "worker-l")


class WorkerLossTests(WorkerProcessTestCase):
    """OPTIONS["worker_losses"] (default 2): lost workers a task outlives even with retries 0."""

    def lose(self, name: str, env: dict[str, str]) -> None:
        """Start a worker and wait for the task to SIGKILL it."""
        proc = self.worker("--holder", name, "--interval", "0.1", env=env)
        self.ready(proc, name)
        assert proc.wait(timeout=60) == -signal.SIGKILL, self.log(proc)

    def test_a_task_whose_worker_is_killed_runs_again_with_retries_zero(self) -> None:
        env = subprocess_env(**SHORT_LEASES)
        result = tasks.kill_first_worker.enqueue()
        self.lose("worker-a", env)
        b = self.worker("--holder", "worker-b", "--interval", "0.1", env=env)
        self.ready(b, "worker-b")
        done = poll_until(lambda: (r := result_of(result.id)).is_finished and r, timeout=60, interval=0.05)
        assert done.status == TaskResultStatus.SUCCESSFUL, done.errors
        assert (done.attempts, done.worker_ids) == (2, ["worker-a", "worker-b"])
        assert [e.exception_class_path for e in done.errors] == ["pikku_django.errors.WorkerLostError"]
        self.stop(b, "worker-b")

    def test_a_task_that_kills_every_worker_fails_once_its_losses_are_spent(self) -> None:
        env = subprocess_env(**SHORT_LEASES)
        result = tasks.kill_every_worker.enqueue()
        # Alone, it is claimed by each worker's take and started at once:
        # every lost worker counts, and one over worker_losses 2 fails it.
        names = [f"worker-{i}" for i in range(3)]
        for name in names:
            self.lose(name, env)
        d = self.worker("--holder", "worker-d", "--interval", "0.1", env=env)
        self.ready(d, "worker-d")
        done = poll_until(lambda: (r := result_of(result.id)).is_finished and r, timeout=60, interval=0.05)
        assert done.status == TaskResultStatus.FAILED
        assert done.worker_ids == names
        # Every lost attempt names its worker; the last is also a StepLeaseExpiredError.
        assert [e.exception_class_path for e in done.errors] == ["pikku_django.errors.WorkerLostError"] * 3
        assert issubclass(done.errors[-1].exception_class, StepLeaseExpiredError)
        assert StepCall.objects.filter(run_id=result.id).count() == 3
        step = WorkflowStep.objects.get(run_id=result.id)
        assert (step.losses, step.provisional) == (3, False)
        self.stop(d, "worker-d")


class TakeClaimProcessTests(WorkerProcessTestCase):
    """A task's step is claimed in its worker's take (issue 14): exactly once, fenced as before."""

    def test_three_workers_of_four_lanes_run_each_task_exactly_once(self) -> None:
        results = [tasks.note.enqueue(f"t{i}") for i in range(60)]
        holders = [f"drain-{i}" for i in range(3)]
        procs = [self.worker("--holder", h, "--concurrency", "4", "--interval", "0.05") for h in holders]
        for proc, holder in zip(procs, holders, strict=True):
            self.ready(proc, holder)
        poll_until(lambda: all(result_of(r.id).is_finished for r in results), timeout=120, interval=0.1)
        for proc, holder in zip(procs, holders, strict=True):
            self.stop(proc, holder)
        done = [result_of(r.id) for r in results]
        assert {d.status for d in done} == {TaskResultStatus.SUCCESSFUL}
        assert {d.attempts for d in done} == {1}
        attempts = WorkflowStepAttempt.objects.filter(step__run_id__in=[r.id for r in results])
        assert set(attempts.values_list("attempt", "status")) == {(1, "succeeded")}
        assert attempts.count() == 60
        calls = StepCall.objects.filter(run_id__in=[r.id for r in results])
        assert sorted(calls.values_list("step", flat=True)) == sorted(f"t{i}" for i in range(60))

    def test_sixteen_lanes_of_overlapping_tasks_lose_no_outcome_to_a_conflict(self) -> None:
        # Sixteen lanes writing attempt rows side by side: on MariaDB two of
        # them deadlock now and then (InnoDB's auto-increment lock against
        # the unique index). The server rolls one back; the lane sends it
        # again, so no lane waits it out as an outage, and no held outcome is
        # lost (which would run its task again as attempt 2, 30 s later).
        later = tasks.nap.using(run_after=timezone.now() + datetime.timedelta(days=1))
        results = [later.enqueue(50) for _ in range(200)]
        proc = self.worker("--holder", "sixteen", "--concurrency", "16", "--interval", "0.05")
        self.ready(proc, "sixteen")
        # All due at once, in one commit: sixteen lanes take and finish side by side.
        WorkflowRun.objects.filter(pk__in=[r.id for r in results]).update(wake_at=Lease.objects.db_now_ms())
        poll_until(lambda: all(result_of(r.id).is_finished for r in results), timeout=120, interval=0.1)
        self.stop(proc, "sixteen")
        done = [result_of(r.id) for r in results]
        assert {d.status for d in done} == {TaskResultStatus.SUCCESSFUL}
        assert {d.attempts for d in done} == {1}
        log = self.log(proc)
        assert "unavailable" not in log and "conflicts" not in log, log

    def test_a_worker_paused_inside_a_task_past_its_leases_has_its_late_result_refused(self) -> None:
        env = subprocess_env(**SHORT_LEASES)
        release = self.tmp / "release"
        result = tasks.hold_until.enqueue(str(release))
        paused = self.worker("--holder", "worker-p", "--interval", "0.1", env=env)
        self.ready(paused, "worker-p")
        poll_until(lambda: StepCall.objects.filter(run_id=result.id).exists(), timeout=60)
        paused.send_signal(signal.SIGSTOP)
        try:
            other = self.worker("--holder", "worker-o", "--interval", "0.1", env=env)
            self.ready(other, "worker-o")
            done = poll_until(
                lambda: (r := result_of(result.id)).is_finished and r, timeout=60, interval=0.05
            )
            assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, "attempt 2")
            assert done.worker_ids == ["worker-p", "worker-o"]
            self.stop(other, "worker-o")
            run = WorkflowRun.objects.get(pk=result.id)
            before = rows_of(run)
            release.touch()
        finally:
            paused.send_signal(signal.SIGCONT)
        # The paused worker's attempt 1 returns: refused, and its pass writes nothing.
        poll_until(lambda: "was superseded" in self.log(paused), timeout=30)
        self.stop(paused, "worker-p")
        assert rows_of(run) == before
        assert result_of(result.id).return_value == "attempt 2"
