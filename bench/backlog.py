"""
The backlog tax (issue 19, "Measure"): an idle worker's look and one sweep
pass with 0, 50,000 and 200,000 runs asleep until later (future ``wake_at``)
and queued tasks (running, due, not yet taken, no step). A benchmark, not a
test: the target (flat within 1.5x) is printed, never asserted.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv/bin/python bench/backlog.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/bench .venv/bin/python bench/backlog.py
    DATABASE_URL=sqlite:////tmp/bench.sqlite3 .venv/bin/python bench/backlog.py

It needs a scratch database: it refuses to start while the run table holds
rows it did not write, and deletes its own when it is done. At each size the
rows are loaded in one INSERT ... SELECT per kind (``tests/support/backlog_rows.py``,
the loader of the query-plan tests), all untouched for an hour, then
ANALYZEd. Per size:

- **idle look**: ``Worker.due()`` (``WorkflowRun.objects.next_due``) with
  the future-dated runs only, so nothing is due: the median of ``--looks``.
- **sweep pass**: ``sweep()`` with both kinds loaded (nothing to wake: a
  queued task waits its turn, a run due later waits by design): the median
  of ``--passes``, and the slowest statement of the last pass.
- **busy look** (shown, not a target): the look with the queued tasks due,
  and 100 due tasks beneath the future-dated runs at a *higher* priority,
  which the look's walk of ``pikku_run_due_idx`` passes over first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import _setup  # noqa: F401  (Django set up, repo root on sys.path)
from django.db import connection

from bench.steps import environment, positive_int
from pikku_django.models import WorkflowRun
from pikku_django.sweep import sweep
from pikku_django.worker import Worker
from tests.support import backlog_rows

SIZES = (0, 50_000, 200_000)


def median_ms(call: Any, times: int) -> float:
    call()
    took = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def slowest_statement(call: Any) -> tuple[float, str]:
    """The slowest statement of one ``call()``: its time (ms) and its first words."""
    timed: list[tuple[float, str]] = []

    def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return execute(text, params, many, context)
        finally:
            timed.append(((time.perf_counter() - started) * 1000, " ".join(text.split())[:90]))

    with connection.execute_wrapper(capture):
        call()
    return max(timed)


def clear() -> None:
    """Delete the backlog; on PostgreSQL VACUUM too, so no size walks the dead index entries of the last."""
    backlog_rows.clear()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM pikku_workflow_run")


def measure(size: int, args: argparse.Namespace) -> dict[str, Any]:
    worker = Worker(holder="bench-backlog")
    row: dict[str, Any] = {"size": size}
    clear()
    started = time.monotonic()
    backlog_rows.load(size, 0)
    row["idle"] = median_ms(worker.due, args.looks)
    assert not worker.due(), "the idle look found work: the database is not a scratch one"
    backlog_rows.load(0, size)
    row["load"] = time.monotonic() - started
    row["busy"] = median_ms(worker.due, args.looks)
    row["sweep"] = median_ms(sweep, args.passes)
    row["slowest"] = slowest_statement(sweep)
    clear()
    backlog_rows.load(size, 100, priority=5)
    row["above"] = median_ms(worker.due, args.looks)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--looks", type=positive_int, default=200, help="looks per size (default %(default)r)"
    )
    parser.add_argument(
        "--passes", type=positive_int, default=20, help="sweep passes per size (default %(default)r)"
    )
    args = parser.parse_args(argv)
    _setup.migrate_if_needed()
    foreign = WorkflowRun.objects.exclude(workflow=backlog_rows.WORKFLOW).count()
    if foreign:
        raise SystemExit(
            f"{foreign} runs in this database are not this benchmark's: point DATABASE_URL at a scratch one."
        )
    began = time.monotonic()
    header = environment()
    try:
        rows = [measure(size, args) for size in SIZES]
    finally:
        clear()
    print("\n".join(header))
    print(f"timing:   median of {args.looks} looks and {args.passes} sweep passes per size")
    print()
    head = (
        f"{'backlog':>8} {'load s':>7} {'idle look ms':>12} {'sweep pass ms':>13} {'busy look ms':>12} "
        f"{'look, future above ms':>21}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['size']:>8,} {r['load']:>7.1f} {r['idle']:>12.2f} {r['sweep']:>13.2f} {r['busy']:>12.2f} "
            f"{r['above']:>21.2f}"
        )
    print()
    for r in rows:
        print(f"slowest statement of a pass at {r['size']:,}: {r['slowest'][0]:.2f} ms  {r['slowest'][1]}")
    print()
    print("target (issue 19; printed, not asserted): 200,000 within 1.5x of 0")
    for key, name in (("idle", "idle look"), ("sweep", "sweep pass")):
        ratio = rows[-1][key] / rows[0][key]
        verdict = "met" if ratio <= 1.5 else "MISSED"
        print(f"  {name:<11} {rows[0][key]:7.2f} ms -> {rows[-1][key]:7.2f} ms = {ratio:.2f}x  {verdict}")
    print(f"(load average {os.getloadavg()[0]:.2f} at the end; {time.monotonic() - began:.0f} s in all)")


if __name__ == "__main__":
    main()
