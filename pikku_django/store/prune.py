"""
Retention by whole trees: a finished run is pruned only with every run below
it (children, their children), each past its own status's retention, and
never while a run above it (parent, grandparent) is unfinished. A parent
whose child its policy keeps waits for it; the child goes on its own terms.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Q, QuerySet

from pikku_django.managers import FINISHED_RUN_STATUSES
from pikku_django.models import WorkflowRun

Trees = dict[Any, set[Any]]

#: Arms of one UNION ALL of the children probes (SQLite allows 500).
PROBES = 100


def _children(runs: QuerySet[WorkflowRun], parents: list[Any]) -> list[tuple[Any, Any]]:
    """
    The (pk, parent_id) of the runs below ``parents``: one equality probe of
    the parent index per parent, joined by UNION ALL, a hundred a statement.
    Never ``parent_id IN (...)``: a table whose runs mostly have no parent
    tells SQLite's planner that a long IN list reads more than a scan.
    """
    found: list[tuple[Any, Any]] = []
    for start in range(0, len(parents), PROBES):
        arms = [
            runs.filter(parent_id=pk).order_by().values_list("pk", "parent_id")
            for pk in parents[start : start + PROBES]
        ]
        # The union's own order_by(): Django 6.1 would order it by the model's Meta.ordering.
        found.extend(arms[0].union(*arms[1:], all=True).order_by() if len(arms) > 1 else arms[0])
    return found


def _descend(runs: QuerySet[WorkflowRun], picked: list[Any], expired: Q) -> tuple[Trees, set[Any], set[Any]]:
    """
    Each picked run's tree (itself and its descendants), the picked runs with
    one not expired below, and the runs that have children.
    """
    trees: dict[Any, set[Any]] = {pk: {pk} for pk in picked}
    owners: dict[Any, set[Any]] = {pk: {pk} for pk in picked}
    bad: set[Any] = set()
    parents: set[Any] = set()
    level = list(picked)
    while level:
        children = _children(runs, level)
        if not children:
            break
        parents |= {parent for _, parent in children}
        ok = set(
            runs.filter(expired, pk__in=[pk for pk, _ in children]).order_by().values_list("pk", flat=True)
        )
        below: dict[Any, set[Any]] = defaultdict(set)
        for pk, parent in children:
            below[pk] |= owners[parent]
        for pk, tops in below.items():
            for top in tops:
                trees[top].add(pk)
            if pk not in ok:
                bad |= tops
        owners = dict(below)
        level = list(below)
    return trees, bad, parents


def _ascend(runs: QuerySet[WorkflowRun], picked: list[Any]) -> set[Any]:
    """The picked runs with an unfinished run anywhere above them."""
    owners: dict[Any, set[Any]] = defaultdict(set)
    for pk, parent in (
        runs.filter(pk__in=picked, parent__isnull=False).order_by().values_list("pk", "parent_id")
    ):
        owners[parent].add(pk)
    bad: set[Any] = set()
    while owners:
        above: dict[Any, set[Any]] = defaultdict(set)
        for pk, parent, status in (
            runs.filter(pk__in=list(owners)).order_by().values_list("pk", "parent_id", "status")
        ):
            if status not in FINISHED_RUN_STATUSES:
                bad |= owners[pk]
            if parent is not None:
                above[parent] |= owners[pk]
        owners = above
    return bad


def whole_trees(runs: QuerySet[WorkflowRun], picked: list[Any], expired: Q, limit: int) -> set[Any]:
    """
    The runs to delete: of the ``picked`` (oldest first), each whose whole
    tree may go, with that tree, up to ``limit`` runs counted with their
    trees. A first tree larger than ``limit`` (a map of 20,000 items) loses
    its leaves first, ``limit`` of them a pass: each is a whole tree of its
    own, expired on its own terms, under finished runs only.
    """
    trees, bad, parents = _descend(runs, picked, expired)
    bad |= _ascend(runs, picked)
    chosen: set[Any] = set()
    for pk in picked:
        if pk in bad or pk in chosen:
            continue
        tree = trees[pk]
        if len(chosen | tree) > limit:
            if not chosen:
                chosen = set(sorted(tree - parents, key=str)[:limit])
            break
        chosen |= tree
    return chosen


def still_whole(runs: QuerySet[WorkflowRun], chosen: set[Any], expired: Q) -> bool:
    """
    Judged again under the lock: every chosen run is still expired, none has
    a child outside the set (a fork, a retry's new child), and every parent
    outside it is finished. Else the pass deletes none of them.
    """
    ids = list(chosen)
    if runs.filter(expired, pk__in=ids).count() != len(ids):
        return False
    if any(pk not in chosen for pk, _ in _children(runs, ids)):
        return False
    return not _ascend(runs, ids)
