"""
Values that cannot be stored are refused before any SQL, naming the value: a
JSON value over ``PIKKU_MAX_JSON_BYTES`` or holding a NUL (or a lone
surrogate) in any string or key; a step result or output that cannot be
stored fails its attempt or run with a clear error; stored errors are
sanitised; whole-number arguments are checked against their column's range.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import TransactionTestCase, override_settings

from pikku_django.errors import InvalidArgumentError
from pikku_django.leases import hold_lease
from pikku_django.managers.base import MAX_ERROR_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, serialize_error
from pikku_django.models import Lease, WorkflowRun, WorkflowSignal, WorkflowStep, WorkflowStepAttempt
from pikku_django.sweep import sweep
from pikku_django.workflows import run_workflow, send_signal, start_workflow
from testproject.testing import tasks
from tests.support.factories import make_run

UNSTORABLE: list[tuple[Any, str]] = [
    ("a\x00b", "a NUL character"),
    ({"k\x00": 1}, "a NUL character"),
    ([1, {"deep": ["x", "\x00"]}], "a NUL character"),
    ({"x": "\ud800"}, "a lone surrogate"),
]


def values_run(**input: Any) -> WorkflowRun:
    return run_workflow(start_workflow("test.values", {"value": "v", **input}).pk)


class UpFrontTests(TransactionTestCase):
    @override_settings(PIKKU_MAX_JSON_BYTES=1_000)
    def test_a_value_over_the_limit_is_refused_naming_it_before_any_sql(self) -> None:
        big = "x" * 1_000
        run = make_run("test.signals")
        with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match=r"^input is 1002 bytes"):
            start_workflow("test.values", big)
        with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="PIKKU_MAX_JSON_BYTES"):
            WorkflowRun.objects.create_run("test.values", {"value": big})
        with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="^payload is"):
            send_signal(run.pk, "go", [big])
        with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match="^args is"):
            tasks.note.enqueue(big)
        # At the limit is fine.
        assert start_workflow("test.values", "x" * 998).input == "x" * 998
        assert WorkflowRun.objects.count() == 2 and not WorkflowSignal.objects.exists()

    def test_nul_characters_and_lone_surrogates_are_refused_naming_the_value(self) -> None:
        run = make_run("test.signals")
        for value, what in UNSTORABLE:
            with (
                self.assertNumQueries(0),
                pytest.raises(InvalidArgumentError, match=f"^input must not hold {what}"),
            ):
                start_workflow("test.values", value)
            with (
                self.assertNumQueries(0),
                pytest.raises(InvalidArgumentError, match=f"^payload must not hold {what}"),
            ):
                send_signal(run.pk, "go", value)
            with (
                self.assertNumQueries(0),
                pytest.raises(InvalidArgumentError, match=f"^args must not hold {what}"),
            ):
                tasks.note.enqueue(value)
        # A backslash and "u0000" is no NUL; a character outside the BMP is no lone surrogate.
        assert start_workflow("test.values", {"s": "\\u0000 \U0001f600"}).input == {"s": "\\u0000 \U0001f600"}
        assert WorkflowRun.objects.count() == 2


class StoredByTheRuntimeTests(TransactionTestCase):
    @override_settings(PIKKU_MAX_JSON_BYTES=1_000)
    def test_a_step_result_over_the_limit_fails_its_attempt_with_a_clear_error(self) -> None:
        run = values_run(repeat=2_000)
        assert run.status == "failed"
        step = WorkflowStep.objects.get(run=run)
        assert (step.status, step.error["type"]) == ("failed", "builtins.TypeError")
        assert "result is 2002 bytes" in step.error["message"]
        assert "PIKKU_MAX_JSON_BYTES" in run.error["message"] and run.error["step"] == "echo"

    def test_a_step_result_holding_a_nul_fails_its_attempt_and_never_reaches_the_database(self) -> None:
        run = values_run(nul=True)
        assert run.status == "failed"
        step = WorkflowStep.objects.get(run=run)
        assert step.status == "failed" and "must not hold a NUL character" in step.error["message"]

    @override_settings(PIKKU_MAX_JSON_BYTES=1_000)
    def test_an_output_that_cannot_be_stored_fails_the_run(self) -> None:
        run = values_run(output="y", output_repeat=2_000)
        assert run.status == "failed" and "output is 2002 bytes" in run.error["message"]
        run = values_run(output="z", output_nul=True)
        assert run.status == "failed" and "must not hold a NUL character" in run.error["message"]

    def test_a_nul_in_a_steps_arguments_only_leaves_them_unshown(self) -> None:
        run = run_workflow(start_workflow("test.double", 21).pk)
        assert run.output == 42
        ctx_run = make_run("test.values")
        started = WorkflowStep.objects.start_step(ctx_run.pk, "s", "x.y", 60_000, {"args": ["\x00"]})
        assert started is not None and started.data is None
        assert WorkflowStep.objects.get(pk=started.pk).data is None


class StoredErrorTests(TransactionTestCase):
    def test_an_error_with_a_nul_and_a_huge_message_is_stored_sanitised_and_bounded(self) -> None:
        run = values_run(value="boom ", repeat=50_000, nul=True, **{"raise": True})
        assert run.status == "failed"
        step = WorkflowStep.objects.get(run=run)
        assert step.status == "failed" and step.error["type"] == "builtins.ValueError"
        for error in (step.error, run.error, WorkflowStepAttempt.objects.get(step=step).error):
            assert "\x00" not in error["message"] and "\x00" not in error["traceback"]
            assert len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS + 100
            assert len(error["traceback"]) <= MAX_TRACEBACK_CHARS + 100
            assert "characters left out" in error["message"]
            assert error["traceback"].rstrip().endswith("boom")

    def test_serialize_error_survives_surrogates_and_a_broken_str(self) -> None:
        class Unprintable(Exception):
            def __str__(self) -> str:
                raise RuntimeError("no")

        assert serialize_error(ValueError("a\ud800b"))["message"] == "a?b"
        assert "could not be read" in serialize_error(Unprintable())["message"]


class RangeTests(TransactionTestCase):
    def test_whole_number_arguments_are_checked_against_their_columns(self) -> None:
        run = make_run("test.values")
        steps = WorkflowStep.objects
        refused: list[tuple[str, Any]] = [
            ("retries", lambda: steps.start_step(run.pk, "a", "x.y", 1_000, retries=2**31 - 1)),
            ("retries", lambda: steps.insert_step(run, "b", "x.y", retries=2**63)),
            ("retry_delay", lambda: steps.start_step(run.pk, "c", "x.y", 1_000, retry_delay=2**31)),
            ("retry_delay", lambda: steps.insert_step(run, "d", "x.y", retry_delay=2**40)),
            ("priority", lambda: start_workflow("test.values", priority=2**31)),
            ("timeout_ms", lambda: start_workflow("test.values", timeout_ms=10**13)),
            ("lease_ms", lambda: steps.start_step(run.pk, "e", "x.y", 2**63)),
            ("ttl_ms", lambda: Lease.objects.acquire("k", "me", 2**31 * 10**4)),
            ("ttl_ms", lambda: hold_lease("k", ttl_ms=2**63).__enter__()),
            ("wake_at", lambda: WorkflowRun.objects.create_run("test.values", wake_at=2**63)),
            ("stalled_after_ms", lambda: sweep(stalled_after_ms=2**62)),
            ("limit", lambda: sweep(limit=2**31)),
        ]
        for argument, call in refused:
            with self.assertNumQueries(0), pytest.raises(InvalidArgumentError, match=f"^{argument} must be"):
                call()
        # The largest allowed are stored as they are.
        steps.insert_step(run, "max", "x.y", retries=2**31 - 2, retry_delay=2**31 - 1)
        assert steps.values_list("retries", "retry_delay").get(step_name="max") == (2**31 - 2, 2**31 - 1)
        assert WorkflowRun.objects.count() == 1
