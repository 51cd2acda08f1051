"""
The passes in progress in this process, so that a worker's flush loop can
write a step success a pass holds (``RunContext``'s pending outcome) once it
has been held ``PENDING_WINDOW_S``, even while the workflow's own code runs
on between two steps: a worker paused or killed after that window never
runs the step again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pikku_django.workflows.context import RunContext

#: How long (seconds) a pass may hold a step's success for its next write
#: before the flush loop writes it on its own.
PENDING_WINDOW_S = 0.1

_passes: set[RunContext] = set()
_lock = threading.Lock()


@contextmanager
def in_progress(ctx: RunContext) -> Iterator[RunContext]:
    """Count ``ctx``'s pass as in progress while the block runs."""
    with _lock:
        _passes.add(ctx)
    try:
        yield ctx
    finally:
        with _lock:
            _passes.discard(ctx)


def holding() -> bool:
    """Does a pass in progress hold a step's success?"""
    with _lock:
        return any(ctx.holds_success() for ctx in _passes)


def write_held_successes(older_than_s: float = PENDING_WINDOW_S) -> int:
    """Write each step success a pass has held longer than ``older_than_s``; returns how many."""
    with _lock:
        passes = list(_passes)
    return sum(ctx.write_held_success(older_than_s) for ctx in passes)
