"""One sweep pass: spent steps, wakes with back-off, undispatched steps, pruning."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.managers import SWEEP_BACKOFF_MAX_MS, WOKEN
from pikku_django.models import Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import PRUNE_GRACE_MS, sweep
from tests.support.factories import age, lapse, lapse_step, make_run, make_step

IDLE = 60_000


def idle_run(step_status: str | None = "pending", **step_fields) -> WorkflowRun:  # type: ignore[no-untyped-def]
    """A running run, not due, idle for twice the window, with one step."""
    run = make_run()
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
    if step_status is not None:
        step = make_step(run)
        WorkflowStep.objects.filter(pk=step.pk).update(status=step_status, **step_fields)
        age(WorkflowStep, step.pk, IDLE * 2)
    age(WorkflowRun, run.pk, IDLE * 2)
    return run


def wake_at(run: WorkflowRun) -> int | None:
    return WorkflowRun.objects.values_list("wake_at", flat=True).get(pk=run.pk)


def everything() -> list:
    """Every row the sweep could touch."""
    return [
        list(model.objects.order_by("pk").values())
        for model in (Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep, WorkflowStepAttempt)
    ]


class StalledSweepTests(TestCase):
    def test_idle_run_with_a_pending_step_is_woken(self) -> None:
        run = idle_run("pending")
        report = sweep(stalled_after_ms=IDLE)
        assert report.stalled_runs == 1 and report.woken_runs == 1
        assert wake_at(run) == WOKEN <= Lease.objects.db_now_ms()
        assert WorkflowRun.objects.due().filter(pk=run.pk).exists()

    def test_steps_in_flight_hold_runs_out(self) -> None:
        now = Lease.objects.db_now_ms()
        runs = [
            idle_run("scheduled"),
            idle_run("suspended"),
            idle_run("running", lease_expires_at=now + IDLE),
            idle_run("running", lease_expires_at=None),
        ]
        report = sweep(stalled_after_ms=IDLE)
        assert report.woken_runs == 0 and report.stalled_runs == 0
        assert all(wake_at(run) is None for run in runs)

    def test_lapsed_lease_does_not_hold_it_out(self) -> None:
        run = idle_run("running", lease_expires_at=Lease.objects.db_now_ms() - 1)
        report = sweep(stalled_after_ms=IDLE)
        assert report.woken_runs == 1 and wake_at(run) == WOKEN

    def test_lapsed_step_wakes_its_run_before_the_stalled_window(self) -> None:
        run = make_run()
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        step = make_step(run, retries=2)
        WorkflowStep.objects.claim(run.pk, step.step_name, step.rpc_name, 60_000)
        lapse_step(step)
        report = sweep(stalled_after_ms=IDLE)
        assert report.lapsed_runs == 1 and report.woken_runs == 1 and wake_at(run) == WOKEN

    def test_recent_activity_and_finished_runs_are_left_alone(self) -> None:
        recent = make_run()
        WorkflowRun.objects.filter(pk=recent.pk).update(wake_at=None)
        make_step(recent)
        done = idle_run("pending")
        WorkflowRun.objects.filter(pk=done.pk).update(status="completed")
        report = sweep(stalled_after_ms=IDLE)
        assert report.woken_runs == 0
        assert wake_at(recent) is None and wake_at(done) is None


HOUR = 3_600_000
TEN_MINUTES = 600_000


def due_later_run(step_status: str | None = None, **step_fields) -> WorkflowRun:  # type: ignore[no-untyped-def]
    """A running run due in an hour, its rows last touched ten minutes ago."""
    run = make_run(wake_at=Lease.objects.db_now_ms() + HOUR)
    if step_status is not None:
        step = make_step(run, retries=1)
        WorkflowStep.objects.filter(pk=step.pk).update(status=step_status, **step_fields)
        age(WorkflowStep, step.pk, TEN_MINUTES)
    age(WorkflowRun, run.pk, TEN_MINUTES)
    return run


class DueLaterTests(TestCase):
    """A run due later is waiting, not stalled (issue 20)."""

    def assert_left_alone(self, run: WorkflowRun) -> None:
        before = wake_at(run)
        report = sweep()  # the default windows: 5 min stalled, 30 s undispatched
        assert (report.stalled_runs, report.undispatched_runs, report.lapsed_runs) == (0, 0, 0)
        assert report.woken_runs == 0 and wake_at(run) == before > Lease.objects.db_now_ms()
        assert WorkflowRun.objects.stalled(IDLE) == []
        assert not WorkflowRun.objects.due().filter(pk=run.pk).exists()

    def test_run_due_in_an_hour_last_touched_ten_minutes_ago_is_not_woken(self) -> None:
        self.assert_left_alone(due_later_run())

    def test_pending_step_of_a_deferred_task_is_not_undispatched(self) -> None:
        self.assert_left_alone(due_later_run("pending"))

    def test_step_failed_with_a_retry_delay_is_left_to_its_delay(self) -> None:
        self.assert_left_alone(due_later_run("failed", retry_delay=HOUR))

    def test_a_run_due_later_with_a_lapsed_step_lost_its_worker_and_is_woken(self) -> None:
        # What a worker's take leaves when the worker dies mid-step: wake_at at
        # the take's run lease end, the step under a lapsed lease.
        run = due_later_run("running", lease_expires_at=Lease.objects.db_now_ms() - 1)
        WorkflowStepAttempt.objects.filter(step__run=run).update(holder="dead-worker")
        Lease.objects.acquire(run.lease_key, "dead-worker", HOUR)
        assert WorkflowRun.objects.stalled(IDLE) == [run.pk]
        report = sweep()
        assert (report.lapsed_runs, report.stalled_runs, report.woken_runs) == (1, 0, 1)
        assert wake_at(run) == WOKEN
        assert Lease.objects.current(run.lease_key) is None

    def test_a_run_that_began_a_wait_after_the_sweep_read_it_keeps_it(self) -> None:
        # Read as stalled, then driven into a sleep before the sweep's UPDATE.
        run = idle_run("pending")
        runs = WorkflowRun.objects.filter(pk=run.pk)
        assert WorkflowRun.objects.stalled(IDLE) == [run.pk]
        runs.update(wake_at=Lease.objects.db_now_ms() + HOUR)
        assert runs.sweep_wakeable().count() == 0
        assert runs.sweep_wake() == 0
        assert wake_at(run) > Lease.objects.db_now_ms()

    def test_dry_run_counts_what_a_pass_does(self) -> None:
        due_later_run("pending")
        due_later_run("failed", retry_delay=HOUR)
        stalled = idle_run("pending")
        dry = sweep(stalled_after_ms=IDLE, dry_run=True)
        done = sweep(stalled_after_ms=IDLE)
        assert (dry.stalled_runs, dry.undispatched_runs, dry.woken_runs) == (1, 1, 1)
        assert (done.stalled_runs, done.undispatched_runs, done.woken_runs) == (1, 1, 1)
        assert wake_at(stalled) == WOKEN


class BackOffTests(TestCase):
    def test_woken_run_is_skipped_until_its_back_off_then_the_back_off_doubles(self) -> None:
        run = idle_run("pending")
        assert sweep(stalled_after_ms=IDLE).woken_runs == 1
        first = WorkflowRun.objects.get(pk=run.pk)
        now = Lease.objects.db_now_ms()
        assert first.sweep_wakes == 1 and now + 25_000 < first.sweep_after <= now + 30_000

        # Nobody drove it; the next sweep finds it stalled but leaves it be.
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        report = sweep(stalled_after_ms=IDLE)
        assert (report.stalled_runs, report.woken_runs, report.backed_off_runs) == (1, 0, 1)
        assert wake_at(run) is None

        # Once the back-off has passed (moved, not slept), it is woken again for twice as long.
        WorkflowRun.objects.filter(pk=run.pk).update(sweep_after=Lease.objects.db_now_ms() - 1)
        assert sweep(stalled_after_ms=IDLE).woken_runs == 1
        second = WorkflowRun.objects.get(pk=run.pk)
        now = Lease.objects.db_now_ms()
        assert second.sweep_wakes == 2 and now + 55_000 < second.sweep_after <= now + 60_000

    def test_back_off_is_capped_at_ten_minutes(self) -> None:
        run = idle_run("pending")
        WorkflowRun.objects.filter(pk=run.pk).update(sweep_wakes=9, swept_at=run.updated_at, sweep_after=0)
        assert sweep(stalled_after_ms=IDLE).woken_runs == 1
        now = Lease.objects.db_now_ms()
        assert WorkflowRun.objects.get(pk=run.pk).sweep_after <= now + SWEEP_BACKOFF_MAX_MS

    def test_activity_since_the_last_wake_starts_the_back_off_again(self) -> None:
        run = idle_run("pending")
        sweep(stalled_after_ms=IDLE)
        WorkflowRun.objects.filter(pk=run.pk).update(sweep_wakes=4)
        # A worker drove it (activity), then it stalled again.
        WorkflowRun.objects.filter(pk=run.pk).update(updated_at=WorkflowRun.objects.get(pk=run.pk).swept_at)
        age(WorkflowRun, run.pk, -1)  # one ms after the sweep's wake
        assert sweep(stalled_after_ms=0).woken_runs == 1
        assert WorkflowRun.objects.get(pk=run.pk).sweep_wakes == 1

    def test_two_sweeps_wake_a_run_once(self) -> None:
        run = idle_run("pending")
        runs = WorkflowRun.objects.filter(pk=run.pk)
        assert runs.sweep_wake() == 1
        assert runs.sweep_wake() == 0


class SpentAndUndispatchedTests(TestCase):
    def test_spent_lapsed_step_is_failed_and_its_run_woken(self) -> None:
        run = make_run()
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        step = make_step(run, retries=0)
        WorkflowStep.objects.claim(run.pk, step.step_name, step.rpc_name, 60_000)
        lapse_step(step)
        report = sweep(stalled_after_ms=IDLE)
        assert report.failed_steps == 1
        step.refresh_from_db()
        assert step.status == "failed" and "lost its worker" in step.error["message"]
        assert wake_at(run) == WOKEN
        assert WorkflowStep.objects.refresh_lease(step.pk, 1000, attempt=1) is False

    def test_undispatched_pending_step_wakes_its_run_once(self) -> None:
        run = make_run()
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        step = make_step(run)
        assert sweep(stalled_after_ms=IDLE).undispatched_runs == 0
        age(WorkflowStep, step.pk, 31_000)
        report = sweep(stalled_after_ms=IDLE)
        assert report.undispatched_runs == 1 and report.woken_runs == 1
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=None)
        assert sweep(stalled_after_ms=IDLE).woken_runs == 0


class PruneTests(TestCase):
    def pass_grace(self) -> None:
        LeaseTokenFloor.objects.update(raised_at=Lease.objects.db_now_ms() - PRUNE_GRACE_MS - 1)

    def test_lapsed_leases_of_finished_runs_are_pruned_and_tokens_keep_rising(self) -> None:
        run = make_run()
        for _ in range(3):  # token 3
            Lease.objects.release(Lease.objects.acquire(run.lease_key, "w", 60_000))
        live_run = make_run()
        Lease.objects.acquire(live_run.lease_key, "w", 60_000)
        WorkflowRun.objects.filter(pk=run.pk).update(status="completed")
        assert sweep().pruned_leases == 0  # the floor is raised first...
        assert LeaseTokenFloor.objects.get().token == 3
        self.pass_grace()
        assert sweep().pruned_leases == 1  # ...and rows under it go once it has stood
        assert not Lease.objects.filter(key=run.lease_key).exists()
        assert Lease.objects.filter(key=live_run.lease_key).exists()
        assert Lease.objects.acquire(run.lease_key, "w", 60_000).token == 4

    def test_old_lapsed_leases_are_pruned_live_and_recent_ones_kept(self) -> None:
        Lease.objects.acquire("old", "w", 60_000)
        lapse("old", ago_ms=8 * 24 * 3600 * 1000)
        Lease.objects.acquire("recent", "w", 60_000)
        lapse("recent")
        Lease.objects.acquire("live", "w", 60_000)
        sweep()
        self.pass_grace()
        assert sweep().pruned_leases == 1
        assert sorted(Lease.objects.values_list("key", flat=True)) == ["live", "recent"]
        assert Lease.objects.acquire("old", "w2", 60_000).token == 2

    def test_a_pass_prunes_at_most_limit_rows(self) -> None:
        for i in range(5):
            Lease.objects.acquire(f"old:{i}", "w", 60_000)
            lapse(f"old:{i}", ago_ms=8 * 24 * 3600 * 1000 + i)
        sweep(limit=2)
        self.pass_grace()
        assert sweep(limit=2).pruned_leases == 2
        self.pass_grace()
        assert sweep(limit=2).pruned_leases == 2
        assert Lease.objects.count() == 1

    def test_a_key_taken_again_before_the_delete_is_kept(self) -> None:
        Lease.objects.acquire("old", "w", 60_000)
        lapse("old", ago_ms=8 * 24 * 3600 * 1000)
        sweep()
        self.pass_grace()
        assert Lease.objects.acquire("old", "w2", 60_000).token == 2
        assert sweep().pruned_leases == 0
        assert Lease.objects.current("old").token == 2


class DryRunAndCommandTests(TestCase):
    def test_dry_run_changes_nothing_but_reports(self) -> None:
        idle_run("pending")
        run = make_run()
        step = make_step(run, retries=0)
        WorkflowStep.objects.claim(run.pk, step.step_name, step.rpc_name, 60_000)
        lapse_step(step)
        Lease.objects.acquire("old", "w", 60_000)
        lapse("old", ago_ms=8 * 24 * 3600 * 1000)
        before = everything()
        report = sweep(stalled_after_ms=IDLE, dry_run=True)
        assert everything() == before
        assert report.dry_run and report.failed_steps == 1 and report.woken_runs >= 1

    def test_command_json(self) -> None:
        idle_run("pending")
        out = io.StringIO()
        call_command("pikku_sweep", "--json", "--stalled-after", "60", stdout=out)
        report = json.loads(out.getvalue())
        assert report["woken_runs"] == 1 and report["dry_run"] is False
        assert set(report) >= {"failed_steps", "stalled_runs", "pruned_leases", "duration_ms"}

    def test_command_summary_and_dry_run(self) -> None:
        idle_run("pending")
        out = io.StringIO()
        call_command("pikku_sweep", "--dry-run", "--stalled-after", "60", stdout=out)
        assert out.getvalue().startswith("Sweep (would): ") and "woke 1 runs" in out.getvalue()
        quiet = io.StringIO()
        call_command("pikku_sweep", "--verbosity", "0", stdout=quiet)
        assert quiet.getvalue() == ""

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="stalled_after_ms"):
            sweep(stalled_after_ms=-1)
        with pytest.raises(ValueError, match="limit"):
            sweep(limit=0)


class IdleSweepTests(TestCase):
    def test_a_sweep_with_nothing_to_do_writes_nothing(self) -> None:
        # Some history that needs nothing: a live lease, a running run with a step in flight.
        Lease.objects.acquire("live", "me", 60_000)
        run = make_run()
        claim_step = make_step(run, "s")
        WorkflowStep.objects.claim(run.pk, claim_step.step_name, claim_step.rpc_name, 60_000)
        sweep()  # the first pass may create the token floor's row
        with CaptureQueriesContext(connection) as queries:
            report = sweep()
        writes = [
            q["sql"]
            for q in queries.captured_queries
            if q["sql"].split()[0].upper() in {"INSERT", "UPDATE", "DELETE"} and "0 = 1" not in q["sql"]
        ]
        assert writes == [], writes
        assert report.woken_runs == 0
