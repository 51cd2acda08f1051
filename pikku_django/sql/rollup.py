"""
The per-minute rollup's upsert (``models.WorkflowMinute``): one statement
adds what a committing batch of outcomes ended (``store.rollup``) to the row
of the database clock's current minute, for each (queue, workflow) of the
batch, in the outcome's own transaction.

The batch's rows ride in one JSON parameter (``rows``: a list of objects
``q`` queue, ``w`` workflow, ``c`` completed, ``f`` failed, ``d0`` … the
delay buckets' counts), so the statement's text is the same however many
rows it adds (and PostgreSQL prepares it once). The rows are grouped by
(queue, workflow) beforehand, as PostgreSQL refuses an upsert that meets
one row twice, and sorted, so that two batches lock rows in one order.
``shard`` is the writer's row of the minute (``store.rollup.SHARDS``).
"""

from __future__ import annotations

#: The start delays' buckets: each one's upper bound in ms, the last one open
#: (longer than an hour). ``delay_<n>`` counts the delays of bucket ``n``.
DELAY_BOUNDS_MS: tuple[int, ...] = (
    10,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    300_000,
    900_000,
    3_600_000,
)

#: The histogram's columns, one per bucket, the open one last.
DELAY_COLUMNS: tuple[str, ...] = tuple(f"delay_{n}" for n in range(len(DELAY_BOUNDS_MS) + 1))


_COUNTS = ("completed", "failed", *DELAY_COLUMNS)
#: Each count's key in a row's JSON object.
_KEYS = ("c", "f", *(f"d{n}" for n in range(len(DELAY_COLUMNS))))


def _columns(q: str) -> str:
    return ", ".join(f"{q}{column}{q}" for column in ("minute", "queue", "workflow", "shard", *_COUNTS))


def _postgresql() -> str:
    types = ", ".join(['"q" varchar', '"w" varchar', *(f'"{key}" integer' for key in _KEYS)])
    values = ", ".join(['r."q"', 'r."w"', "%(shard)s::integer", *(f'r."{key}"' for key in _KEYS)])
    added = ",\n    ".join(f'"{c}" = {{minute}}."{c}" + EXCLUDED."{c}"' for c in _COUNTS)
    return f"""
INSERT INTO {{minute}} ({_columns('"')})
SELECT clock.minute, {values}
FROM (SELECT {{now}} / 60000 * 60000 AS minute) AS clock,
    jsonb_to_recordset(%(rows)s::jsonb) AS r({types})
ON CONFLICT ("minute", "queue", "workflow", "shard") DO UPDATE SET
    {added}
"""


def _mysql() -> str:
    paths = ", ".join(
        [
            "`q` VARCHAR(255) CHARACTER SET utf8mb4 PATH '$.q'",
            "`w` VARCHAR(255) CHARACTER SET utf8mb4 PATH '$.w'",
            *(f"`{key}` INT PATH '$.{key}'" for key in _KEYS),
        ]
    )
    values = ", ".join(["r.`q`", "r.`w`", "%(shard)s", *(f"r.`{key}`" for key in _KEYS)])
    added = ",\n    ".join(f"`{c}` = {{minute}}.`{c}` + VALUES(`{c}`)" for c in _COUNTS)
    return f"""
INSERT INTO {{minute}} ({_columns("`")})
SELECT {{now}} DIV 60000 * 60000, {values}
FROM JSON_TABLE(%(rows)s, '$[*]' COLUMNS ({paths})) AS r
ON DUPLICATE KEY UPDATE
    {added}
"""


def _sqlite() -> str:
    values = ", ".join(
        [
            "json_extract(r.value, '$.q')",
            "json_extract(r.value, '$.w')",
            "%(shard)s",
            *(f"json_extract(r.value, '$.{key}')" for key in _KEYS),
        ]
    )
    added = ",\n    ".join(f'"{c}" = "{c}" + excluded."{c}"' for c in _COUNTS)
    # "WHERE true": SQLite reads an upsert's SELECT so only with a WHERE.
    return f"""
INSERT INTO {{minute}} ({_columns('"')})
SELECT {{now}} / 60000 * 60000, {values}
FROM json_each(%(rows)s) AS r WHERE true
ON CONFLICT ("minute", "queue", "workflow", "shard") DO UPDATE SET
    {added}
"""


#: The JSON keys of a row of ``rows``, after ``q`` and ``w``, in the order of the counts.
ROW_KEYS = _KEYS

ROLLUP_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "minute_add": {"postgresql": _postgresql(), "mysql": _mysql(), "sqlite": _sqlite()},
}
