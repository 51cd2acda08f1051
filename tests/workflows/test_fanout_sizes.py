"""
A map whose results together could not be stored is refused before its
items run, not after: each item's result is bounded by its share of
``PIKKU_MAX_JSON_BYTES`` (the limit over the number of items, less the
list's separators), the first item over it fails with an error naming the
bound and the limit, the items not started never start, and a retry once
the limit allows the results succeeds.
"""

from __future__ import annotations

from typing import Any

from django.test import TransactionTestCase, override_settings

from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows import retry_workflow, run_workflow, start_workflow
from pikku_django.workflows.context import RunContext

#: 20 items under a 1,000-byte limit: each result may take 1000 // 20 - 2 = 48 bytes of JSON.
COUNT = 20
LIMIT = 1000
BOUND = 48


def items_of(run: WorkflowRun) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent=run, parent_step__isnull=False).order_by("parent_index"))


def drive(run: WorkflowRun) -> WorkflowRun:
    """Drive the parent and every item it releases to the end, as workers would; the parent as it ends."""
    run_workflow(run.pk)
    while due := [item for item in items_of(run) if item.status == "running" and item.wake_at is not None]:
        for item in due:
            run_workflow(item.pk)
    return run_workflow(run.pk)


def begun(run: WorkflowRun) -> int:
    """How many of the run's items began (have a step)."""
    return WorkflowStep.objects.filter(run__parent=run, run__parent_step__isnull=False).count()


def start(size: int, **options: Any) -> WorkflowRun:
    """A map of ``COUNT`` items, each returning ``size`` characters (``size + 2`` bytes of JSON)."""
    return start_workflow("test.map_padded", {"items": [{"n": size}] * COUNT, **options})


@override_settings(PIKKU_MAX_JSON_BYTES=LIMIT)
class MapResultSizeTests(TransactionTestCase):
    def test_results_at_their_share_of_the_limit_are_stored(self) -> None:
        run = drive(start(BOUND - 2))
        assert run.status == "completed", run.error
        assert run.output == ["x" * (BOUND - 2)] * COUNT
        step = WorkflowStep.objects.get(run=run, step_name="items")
        assert step.status == "succeeded"

    def test_an_item_over_its_share_fails_before_the_rest_run(self) -> None:
        # 49 bytes each: 20 of them would be 1,018 bytes of list, over the limit.
        run = drive(start(BOUND - 1, max_parallel=2))
        assert run.status == "failed"
        assert begun(run) == 1
        statuses = [item.status for item in items_of(run)]
        assert statuses.count("failed") == 1 and statuses.count("cancelled") == COUNT - 1
        failed = next(item for item in items_of(run) if item.status == "failed")
        message = WorkflowStep.objects.get(run=failed).error["message"]
        assert f"result is {BOUND + 1} bytes of JSON" in message, message
        assert f"at most {BOUND} bytes" in message and f"PIKKU_MAX_JSON_BYTES ({LIMIT})" in message, message
        assert f"at most {BOUND} bytes" in run.error["message"], run.error

    def test_a_retry_succeeds_once_the_limit_allows_the_results(self) -> None:
        run = drive(start(BOUND - 1))
        assert run.status == "failed"
        with override_settings(PIKKU_MAX_JSON_BYTES=2 * LIMIT):
            assert retry_workflow(run.pk)
            run = drive(run)
        assert run.status == "completed", run.error
        assert run.output == ["x" * (BOUND - 1)] * COUNT

    def test_a_map_whose_results_could_never_fit_is_refused_before_any_row(self) -> None:
        ctx = RunContext(WorkflowRun.objects.create_run("test.map_padded"), using="default")
        refused = r"^items: the results of 200 items cannot be stored"
        with self.assertRaisesRegex(InvalidArgumentError, refused):
            ctx.map("items", len, [{"n": 0}] * 200)
        assert WorkflowStep.objects.count() == 0
