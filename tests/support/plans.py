"""
What a statement costs, as each vendor can tell: the SELECTs a call sends
(``capture_selects``), how much of the tables one of them read
(``examined``), and its plan as text (``plan_text``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connection


def capture_selects(call: Callable[[], object]) -> list[tuple[str, Any]]:
    """The SELECTs ``call()`` sends that read the run or step table (not the locking ones)."""
    captured: list[tuple[str, Any]] = []

    def capture(execute, text, params, many, context):  # type: ignore[no-untyped-def]
        reads = text.lstrip().startswith(("SELECT", "(SELECT")) and "FOR UPDATE" not in text
        if reads and ("pikku_workflow_run" in text or "pikku_workflow_step" in text):
            captured.append((text, params))
        return execute(text, params, many, context)

    with connection.execute_wrapper(capture):
        call()
    return captured


def examined(text: str, params: Any) -> int:
    """
    How much of the tables one run of a SELECT read, as each vendor can tell:
    PostgreSQL the buffers it touched (an index walk that filters shows in
    them), MariaDB the rows it read (ANALYZE's r_rows), SQLite the virtual
    machine steps it took (a progress handler called every 10).
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params)
            plan = cursor.fetchone()[0][0]["Plan"]
            return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE FORMAT=JSON " + text, params)
            return int(sum(_r_rows(cursor.fetchone()[0])))
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0

        raw = connection.connection
        raw.set_progress_handler(step, 10)
        try:
            cursor.execute(text, params)
            cursor.fetchall()
        finally:
            raw.set_progress_handler(None, 10)
        return steps[0] * 10


def _r_rows(analyzed: str) -> Iterator[float]:
    """
    Every table access's rows read (r_rows x r_loops) in MariaDB's ANALYZE
    FORMAT=JSON, read as text: a condition on a JSON path is printed in it
    with its quotes unescaped, so it is not always valid JSON.
    """
    for loops, rows in TABLE_READS.findall(analyzed):
        yield float(loops) * (0.0 if rows == "null" else float(rows))


TABLE_READS = re.compile(r'"r_loops":\s*([\d.]+),[^{}]*?"r_rows":\s*([\d.]+|null)')


def plan_text(text: str, params: Any) -> str:
    """The plan, as the vendor writes it: EXPLAIN, or SQLite's EXPLAIN QUERY PLAN."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + text, params)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + text, params)
        names = [column[0] for column in cursor.description]
        # MariaDB's rows name every possible key: keep the one it reads.
        shown = [i for i, name in enumerate(names) if name != "possible_keys"]
        return "\n".join(" ".join(str(row[i]) for i in shown) for row in cursor.fetchall())
