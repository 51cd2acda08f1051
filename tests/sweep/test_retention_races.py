"""
A run retried or forked while a prune picks it is kept whole or gone whole:
the retry or fork lands between the prune's read and its write.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from django.test import TransactionTestCase

from pikku_django import sweep as sweep_module
from pikku_django.errors import InvalidArgumentError
from pikku_django.models import WorkflowRun
from pikku_django.store import operate as operate_module
from pikku_django.sweep import prune_runs
from pikku_django.workflows import fork_workflow, retry_workflow
from tests.sweep.test_retention_trees import kept, run


class RetryRaceTests(TransactionTestCase):
    def test_a_grandchild_retried_after_the_pick_keeps_its_whole_tree(self) -> None:
        grandparent = run("completed")
        parent = run("completed", grandparent)
        grandchild = run("failed", parent)
        lock = sweep_module.take_write_lock
        revived: list[bool] = []

        def retry_then_lock(alias: str) -> Any:
            revived.append(retry_workflow(grandchild.pk))
            return lock(alias)

        with mock.patch.object(sweep_module, "take_write_lock", retry_then_lock):
            assert prune_runs() == 0
        assert revived == [True]
        assert kept() == {grandparent.pk, parent.pk, grandchild.pk}
        assert WorkflowRun.objects.get(pk=grandchild.pk).status == "running"


class ForkRaceTests(TransactionTestCase):
    def test_a_fork_whose_original_is_pruned_meanwhile_is_a_clear_error(self) -> None:
        original = run("completed")
        write = operate_module.in_transaction

        def prune_then_write(alias: str, fn: Any) -> Any:
            assert prune_runs() == 1  # the original goes after the fork read it
            return write(alias, fn)

        with (
            mock.patch.object(operate_module, "in_transaction", prune_then_write),
            pytest.raises(InvalidArgumentError, match="run_id"),
        ):
            fork_workflow(original.pk)
        assert kept() == set()
