"""
Retention by whole trees: no run is pruned with an unfinished run anywhere in
its tree, and each run keeps its own status's retention (a parent pruned
early waits for the children its policy does not take).
"""

from __future__ import annotations

from django.test import TransactionTestCase, override_settings

from pikku_django.models import WorkflowRun
from pikku_django.sweep import prune_runs
from tests.support.factories import age, make_run

DAY_MS = 24 * 3600 * 1000


def run(status: str, parent: WorkflowRun | None = None, days: int = 40) -> WorkflowRun:
    made = make_run("test.double", parent=parent) if parent is not None else make_run("test.double")
    WorkflowRun.objects.filter(pk=made.pk).update(status=status)
    age(WorkflowRun, made.pk, days * DAY_MS)
    return made


def kept() -> set[object]:
    return set(WorkflowRun.objects.values_list("pk", flat=True))


class TreeTests(TransactionTestCase):
    def test_a_running_grandchild_keeps_its_finished_grandparent_and_parent(self) -> None:
        grandparent = run("completed")
        parent = run("completed", grandparent)
        grandchild = run("running", parent)  # retried by an operator: running again
        assert prune_runs() == 0
        assert kept() == {grandparent.pk, parent.pk, grandchild.pk}

    def test_a_finished_grandchild_under_a_running_grandparent_is_kept(self) -> None:
        grandparent = run("running")
        parent = run("completed", grandparent)
        grandchild = run("completed", parent)
        assert prune_runs() == 0
        assert kept() == {grandparent.pk, parent.pk, grandchild.pk}

    def test_a_whole_finished_tree_goes_together(self) -> None:
        grandparent = run("completed")
        parent = run("completed", grandparent)
        run("completed", parent)
        assert prune_runs() == 3
        assert kept() == set()


class OwnRetentionTests(TransactionTestCase):
    @override_settings(PIKKU_RETENTION_MS={"completed": 7 * DAY_MS, "failed": None, "cancelled": None})
    def test_a_parent_never_takes_a_child_its_own_policy_keeps(self) -> None:
        parent = run("completed")
        failed = run("failed", parent)
        cancelled = run("cancelled", parent)
        run("completed", parent)
        # The completed child goes on its own terms; the failed and the
        # cancelled are kept for ever, and their parent waits for them.
        assert prune_runs() == 1
        assert kept() == {parent.pk, failed.pk, cancelled.pk}


class LimitTests(TransactionTestCase):
    def test_the_limit_bounds_a_pass_counted_with_a_tree(self) -> None:
        parent = run("completed")
        items = [run("completed", parent) for _ in range(5)]
        # A pass deletes at most two runs: a tree of six loses its leaves first.
        assert prune_runs(2) == 2
        assert parent.pk in kept() and len(kept()) == 4
        assert prune_runs(2) == 2
        assert prune_runs(2) == 2 and kept() == set()
        assert {item.pk for item in items} & kept() == set()
