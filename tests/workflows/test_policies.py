"""
Policies on steps: max_attempts, backoff (the run's wake_at on the database
clock), retry_on and NonRetryableError; the policy values themselves.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import SimpleTestCase, TransactionTestCase

from pikku_django.errors import InvalidArgumentError, NonRetryableError, PikkuError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.policy import NonRetryableError as ReExported
from pikku_django.policy import exponential, fixed, step_policy
from pikku_django.worker import Worker
from pikku_django.workflows import run_workflow, start_workflow, workflow
from tests.support.children import poll_until
from tests.support.workers import epoch_ms

calls: dict[str, int] = {}


class Flaky(Exception):
    pass


class Other(Exception):
    pass


def failing(key: str, failures: int, kind: str = "flaky") -> str:
    """Fails ``failures`` times (with an error of ``kind``), then succeeds."""
    calls[key] = calls.get(key, 0) + 1
    if calls[key] <= failures:
        error = {"flaky": Flaky, "other": Other, "final": NonRetryableError}[kind]
        raise error(f"{key} failure {calls[key]}")
    return f"{key} ok after {calls[key]}"


def stop_after_two(attempt: int, error: BaseException) -> int | None:
    return None if attempt >= 2 else 0


BACKOFFS: dict[str, Any] = {
    "exp": exponential(first_ms=300, factor=2),
    "long": fixed(60_000),
    "ten": fixed(600_000),
    "stop": stop_after_two,
    "none": None,
}


@workflow("policies.step")
def policy_step(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.step(
        "flaky",
        failing,
        input["key"],
        input["failures"],
        input.get("kind", "flaky"),
        max_attempts=input.get("max_attempts"),
        backoff=BACKOFFS[input.get("backoff", "none")],
        retry_on=(Flaky,) if input.get("retry_on") else None,
    )


def map_item(item: dict[str, Any]) -> str:
    return failing(item["key"], item["failures"], item.get("kind", "flaky"))


@workflow("policies.map")
def policy_map(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.map(
        "items",
        map_item,
        input["items"],
        max_attempts=3,
        backoff=fixed(200),
        retry_on=(Flaky, NonRetryableError),
    )


def drive(run: WorkflowRun, timeout: float = 15.0) -> WorkflowRun:
    """Pass after pass (of the run and its items) until the run ends; a run not yet due runs nothing."""

    def ended() -> WorkflowRun | None:
        for item in WorkflowRun.objects.filter(parent=run, status="running"):
            run_workflow(item.pk)
        again = run_workflow(run.pk)
        return again if again.is_finished else None

    return poll_until(ended, timeout, interval=0.01)


def history(run: WorkflowRun) -> list[WorkflowStepAttempt]:
    return list(WorkflowStepAttempt.objects.filter(step__run=run).order_by("attempt"))


class StepPolicyTests(TransactionTestCase):
    def setUp(self) -> None:
        calls.clear()

    def test_backoff_gaps_on_the_attempt_rows(self) -> None:
        run = start_workflow(
            "policies.step", {"key": "gaps", "failures": 2, "max_attempts": 3, "backoff": "exp"}
        )
        run = drive(run)
        assert run.status == "completed" and calls["gaps"] == 3
        rows = history(run)
        assert [row.status for row in rows] == ["failed", "failed", "succeeded"]
        # From the attempt rows (the database clock): at least the backoff, at most it plus a poll.
        for before, after, delay in zip(rows, rows[1:], (300, 600), strict=False):
            gap = epoch_ms(after.running_at) - epoch_ms(before.failed_at)
            assert delay <= gap <= delay + 1_000, (delay, gap)

    def test_the_delay_is_the_runs_wake_at_on_the_database_clock(self) -> None:
        run = start_workflow(
            "policies.step", {"key": "wake", "failures": 1, "max_attempts": 2, "backoff": "long"}
        )
        run = run_workflow(run.pk)
        assert run.status == "running" and calls["wake"] == 1
        step = WorkflowStep.objects.get(run=run)
        assert (step.status, step.retry_delay) == ("failed", 60_000)
        assert abs(run.wake_at - (epoch_ms(step.updated_at) + 60_000)) <= 1
        assert run.wake_at > Lease.objects.db_now_ms() + 55_000
        # Not due: another pass runs nothing.
        run_workflow(run.pk)
        assert calls["wake"] == 1

    def test_max_attempts_counts_raised_attempts_and_keeps_a_loss_budget(self) -> None:
        run = drive(start_workflow("policies.step", {"key": "max", "failures": 9, "max_attempts": 3}))
        assert run.status == "failed" and calls["max"] == 3
        step = WorkflowStep.objects.get(run=run)
        assert (step.attempt, step.retries, step.worker_losses) == (3, 2, 2)

    def test_an_error_outside_retry_on_fails_at_once(self) -> None:
        run = drive(
            start_workflow(
                "policies.step",
                {"key": "other", "failures": 9, "kind": "other", "max_attempts": 5, "retry_on": True},
            )
        )
        assert run.status == "failed" and calls["other"] == 1
        assert run.error["message"] == "other failure 1"
        step = WorkflowStep.objects.get(run=run)
        assert step.is_exhausted and step.attempt == 1

    def test_retry_on_retries_its_own_errors(self) -> None:
        run = drive(
            start_workflow(
                "policies.step", {"key": "own", "failures": 2, "max_attempts": 5, "retry_on": True}
            )
        )
        assert run.status == "completed" and calls["own"] == 3

    def test_a_non_retryable_error_fails_at_once(self) -> None:
        run = drive(
            start_workflow("policies.step", {"key": "nr", "failures": 9, "kind": "final", "max_attempts": 5})
        )
        assert run.status == "failed" and calls["nr"] == 1
        assert run.error["type"].endswith("NonRetryableError")

    def test_a_backoff_that_answers_none_stops(self) -> None:
        run = drive(
            start_workflow(
                "policies.step", {"key": "stop", "failures": 9, "max_attempts": 9, "backoff": "stop"}
            )
        )
        assert run.status == "failed" and calls["stop"] == 2

    def test_a_lane_serves_other_work_during_a_backoff(self) -> None:
        waiting = start_workflow(
            "policies.step", {"key": "lane", "failures": 1, "max_attempts": 2, "backoff": "long"}
        )
        worker = Worker(holder="w-policies", once=True, interval=0.01, concurrency=1)
        assert worker.lanes[0].drive_next() is True
        assert calls["lane"] == 1
        other = start_workflow("policies.step", {"key": "next", "failures": 0})
        assert worker.lanes[0].drive_next() is True
        other.refresh_from_db()
        waiting.refresh_from_db()
        assert other.status == "completed" and waiting.status == "running" and calls["lane"] == 1

    def test_map_items_keep_the_policy(self) -> None:
        items = [{"key": "m0", "failures": 1}, {"key": "m1", "failures": 2}]
        run = drive(start_workflow("policies.map", {"items": items}))
        assert run.status == "completed" and (calls["m0"], calls["m1"]) == (2, 3)
        attempts = list(
            WorkflowStepAttempt.objects.filter(step__run__parent=run, step__step_name="items").order_by(
                "attempt"
            )
        )
        failed = [row for row in attempts if row.status == "failed"]
        assert len(failed) == 3
        for row in failed:
            after = next(a for a in attempts if a.step_id == row.step_id and a.attempt == row.attempt + 1)
            assert epoch_ms(after.running_at) - epoch_ms(row.failed_at) >= 200

    def test_a_map_item_that_raises_a_non_retryable_error_fails_at_once(self) -> None:
        items = [{"key": "n0", "failures": 9, "kind": "final"}]
        run = drive(start_workflow("policies.map", {"items": items}))
        assert run.status == "failed" and calls["n0"] == 1

    def test_no_options_is_judged_as_before(self) -> None:
        run = drive(start_workflow("policies.step", {"key": "plain", "failures": 9}))
        step = WorkflowStep.objects.get(run=run)
        assert run.status == "failed" and step.worker_losses is None and step.retry_delay is None


class PolicyValueTests(SimpleTestCase):
    def test_exponential(self) -> None:
        backoff = exponential(first_ms=1_000, factor=2, max_ms=5_000)
        assert [backoff(n, Flaky()) for n in range(1, 6)] == [1_000, 2_000, 4_000, 5_000, 5_000]
        spread = exponential(first_ms=1_000, jitter=0.1)
        assert all(900 <= spread(1, Flaky()) <= 1_100 for _ in range(200))
        assert exponential(first_ms=10)(10_000, Flaky()) > 0

    def test_fixed(self) -> None:
        assert fixed(250)(7, Flaky()) == 250

    def test_bad_values_name_their_argument(self) -> None:
        for call, argument in [
            (lambda: exponential(first_ms=-1), "first_ms"),
            (lambda: exponential(first_ms=1, factor=0.5), "factor"),
            (lambda: exponential(first_ms=1, jitter=2), "jitter"),
            (lambda: exponential(first_ms=1, max_ms="x"), "max_ms"),
            (lambda: fixed(-5), "ms"),
            (lambda: step_policy(max_attempts=0), "max_attempts"),
            (lambda: step_policy(backoff="soon"), "backoff"),
            (lambda: step_policy(retry_on=(Flaky, "x")), "retry_on"),
            (lambda: step_policy(timeout_ms=0), "timeout_ms"),
            (lambda: step_policy(worker_losses=-1), "worker_losses"),
            (lambda: step_policy(retries=1, max_attempts=2), "max_attempts"),
        ]:
            with pytest.raises(ValueError, match=argument) as caught:
                call()
            assert isinstance(caught.value, PikkuError)

    def test_verdicts(self) -> None:
        policy = step_policy(retry_on=Flaky, backoff=exponential(first_ms=100))
        assert policy is not None
        assert policy.verdict(1, Flaky()).delay == 100
        assert policy.verdict(1, Other()).final
        assert policy.verdict(1, NonRetryableError("no")).final
        assert step_policy() is None
        assert ReExported is NonRetryableError and issubclass(NonRetryableError, PikkuError)
        assert not issubclass(InvalidArgumentError, NonRetryableError)
