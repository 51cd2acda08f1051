"""
The runtime's hooks for OpenTelemetry (``pikku_django.otel``), each doing
nothing when the ``otel`` extra is not installed, whose modules are then
never imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

otel: ModuleType | None
try:
    from pikku_django import otel
except ImportError:  # the ``otel`` extra is not installed
    otel = None

__all__ = ["Enqueue", "attempt", "enqueue", "run_pass", "worker_lost"]


@dataclass
class Enqueue:
    """A start being traced: the trace context to store on its run (None: none)."""

    context: dict[str, str] | None = None
    _span: Any = field(default=None, repr=False)

    def started(self, run: Any) -> None:
        """The run was created."""
        if otel is not None and self._span is not None:
            otel.started(self._span, run)


@contextmanager
def enqueue(workflow: str, queue: str) -> Iterator[Enqueue]:
    """Around the creation of a run: its PRODUCER span, when the extra is installed."""
    if otel is None:
        yield Enqueue()
        return
    with otel.enqueue_span(workflow, queue) as (span, carrier):
        yield Enqueue(carrier or None, span)


@contextmanager
def run_pass(run: Any, holder: str | None, token: int | None) -> Iterator[None]:
    """Around a pass of ``run``."""
    if otel is None:
        yield
        return
    with otel.pass_span(run, holder, token):
        yield


@contextmanager
def attempt(run: Any, step_name: str, number: int, holder: str | None, token: int | None) -> Iterator[None]:
    """Around an attempt of a step of ``run``."""
    if otel is None:
        yield
        return
    with otel.attempt_span(run, step_name, number, holder, token):
        yield


def worker_lost(run: Any, step_name: str, number: int, holder: str) -> None:
    """A step of ``run`` taken over from a lost worker, by attempt ``number``."""
    if otel is not None:
        otel.worker_lost_event(run, step_name, number, holder)
