"""
Every guarded statement, one named constant per vendor.

Each decision (take a lease, renew it, claim a step, fence an attempt) is one
statement whose WHERE clause *is* the decision: two workers racing on the same
row are serialised by the row lock, the loser's guard no longer matches, and
its statement changes nothing. Nothing is read first and judged in Python.

Templates use ``{now}`` for the clock (``clock.py``) and ``{lease}`` for the
quoted table name; values are always ``%(name)s`` parameters. ``statement()``
picks the variant for a connection and is the only place that does.
"""

from __future__ import annotations

import functools

from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper

from pikku_django.clock import MYSQL_NOW_MS, POSTGRESQL_NOW_MS, SQLITE_NOW_MS

# ---------------------------------------------------------------------------
# Leases
# ---------------------------------------------------------------------------

#: One round trip. The ``held`` CTE is a plain read: while another holder's
#: lease is live it yields a row, the INSERT selects nothing, and the
#: statement takes no row lock and writes nothing (no WAL, no commit flush).
#: Otherwise the upsert decides under the row lock: its WHERE is re-checked
#: against the newest row version, so a racer that took the key meanwhile
#: makes it match nothing. The clock is read once, in ``clock``: a stale read
#: (after waiting on a lock) only errs towards refusing.
#:
#: A new row's token starts above both the token floor (``LeaseTokenFloor``,
#: raised before the sweep prunes rows) and the row this statement's snapshot
#: saw: a prune that deleted that row after the snapshot was taken cannot make
#: its token go backwards.
POSTGRESQL_LEASE_ACQUIRE = """
WITH clock AS (SELECT {now} AS now_ms),
cur AS (SELECT "holder", "token", "expires_at" FROM {lease} WHERE "key" = %(key)s::varchar)
INSERT INTO {lease} AS l ("key", "holder", "token", "expires_at")
SELECT %(key)s::varchar, %(holder)s::varchar,
    GREATEST(COALESCE((SELECT "token" FROM cur), 0),
             COALESCE((SELECT "token" FROM {floor} WHERE "id" = 1), 0)) + 1,
    clock.now_ms + %(ttl_ms)s
FROM clock
WHERE NOT EXISTS (
    SELECT 1 FROM cur WHERE cur."holder" <> %(holder)s::varchar AND cur."expires_at" > clock.now_ms
)
ON CONFLICT ("key") DO UPDATE SET
    "token" = CASE
        WHEN l."holder" = EXCLUDED."holder" AND l."expires_at" > (SELECT now_ms FROM clock)
        THEN l."token" ELSE l."token" + 1 END,
    "holder" = EXCLUDED."holder",
    "expires_at" = EXCLUDED."expires_at"
WHERE l."holder" = EXCLUDED."holder" OR l."expires_at" <= (SELECT now_ms FROM clock)
RETURNING "key", "holder", "token", "expires_at"
"""

#: SQLite serialises writers on the database lock, and 'now' is fixed for the
#: statement, so the same upsert is exact. (The SELECT needs its WHERE for
#: SQLite to parse ON CONFLICT as the upsert clause.)
SQLITE_LEASE_ACQUIRE = """
INSERT INTO {lease} AS l ("key", "holder", "token", "expires_at")
SELECT %(key)s, %(holder)s, COALESCE((SELECT "token" FROM {floor} WHERE "id" = 1), 0) + 1, {now} + %(ttl_ms)s
WHERE NOT EXISTS (
    SELECT 1 FROM {lease} AS h
    WHERE h."key" = %(key)s AND h."holder" <> %(holder)s AND h."expires_at" > {now}
)
ON CONFLICT ("key") DO UPDATE SET
    "token" = CASE WHEN l."holder" = excluded."holder" AND l."expires_at" > {now}
        THEN l."token" ELSE l."token" + 1 END,
    "holder" = excluded."holder",
    "expires_at" = excluded."expires_at"
WHERE l."holder" = excluded."holder" OR l."expires_at" <= {now}
RETURNING "key", "holder", "token", "expires_at"
"""

#: ON DUPLICATE KEY UPDATE has no WHERE, so every assignment carries the
#: guard, and MySQL evaluates them left to right against values already
#: assigned: ``token`` and ``holder`` read the old ``expires_at``, then
#: ``expires_at`` reads the new ``holder``, which is ours exactly when we won.
#: A lost race assigns every column its own value and so changes nothing.
#: UTC_TIMESTAMP is fixed for the statement, so every ``{now}`` is one instant.
#: The key and holder columns compare byte for byte (binary collation).
MYSQL_LEASE_UPSERT = """
INSERT INTO {lease} (`key`, `holder`, `token`, `expires_at`)
VALUES (%(key)s, %(holder)s, COALESCE((SELECT `token` FROM {floor} WHERE `id` = 1), 0) + 1,
        {now} + %(ttl_ms)s)
ON DUPLICATE KEY UPDATE
    `token` = IF(`expires_at` <= {now}, `token` + 1, `token`),
    `holder` = IF(`expires_at` <= {now}, %(holder)s, `holder`),
    `expires_at` = IF(`holder` = %(holder)s, {now} + %(ttl_ms)s, `expires_at`)
"""

#: MySQL 8 has no RETURNING: the outcome is read back, not taken from the row
#: count (which counts rows *matched* under CLIENT.FOUND_ROWS, so a lost race
#: and a won one can both report 1). Only this holder writes its own name into
#: the row, so finding it there, live, means the upsert won.
MYSQL_LEASE_ACQUIRE = (
    MYSQL_LEASE_UPSERT,
    """
SELECT `key`, `holder`, `token`, `expires_at` FROM {lease}
WHERE `key` = %(key)s AND `holder` = %(holder)s AND `expires_at` > {now}
""",
)

#: MariaDB returns the row as the upsert left it: ours when ``holder`` is ours.
MARIADB_LEASE_ACQUIRE = MYSQL_LEASE_UPSERT + "RETURNING `key`, `holder`, `token`, `expires_at`"

#: Renew only this holder's own live lease of this token.
POSTGRESQL_LEASE_REFRESH = """
UPDATE {lease} SET "expires_at" = clock.now_ms + %(ttl_ms)s
FROM (SELECT {now} AS now_ms) AS clock
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
    AND "expires_at" > clock.now_ms
RETURNING "key", "holder", "token", "expires_at"
"""

SQLITE_LEASE_REFRESH = """
UPDATE {lease} SET "expires_at" = {now} + %(ttl_ms)s
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
    AND "expires_at" > {now}
RETURNING "key", "holder", "token", "expires_at"
"""

#: No RETURNING on MySQL/MariaDB UPDATE: the new expiry travels back through
#: LAST_INSERT_ID(expr), which the client reads as the statement's insert id
#: (cursor.lastrowid) without a second statement. Whether the guard matched is
#: the row count, which is rows *matched* because Django's MySQL backend sets
#: CLIENT.FOUND_ROWS (system check pikku_django.E010 guards that).
MYSQL_LEASE_REFRESH = """
UPDATE {lease} SET `expires_at` = LAST_INSERT_ID({now} + %(ttl_ms)s)
WHERE `key` = %(key)s AND `holder` = %(holder)s AND `token` = %(token)s
    AND `expires_at` > {now}
"""

#: Lapse the lease if it is still this holder's and token's. The token stays,
#: so the next holder gets a higher one; the expiry never moves later.
POSTGRESQL_LEASE_RELEASE = """
UPDATE {lease} SET "expires_at" = LEAST("expires_at", {now})
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
"""

SQLITE_LEASE_RELEASE = """
UPDATE {lease} SET "expires_at" = MIN("expires_at", {now})
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
"""

MYSQL_LEASE_RELEASE = """
UPDATE {lease} SET `expires_at` = LEAST(`expires_at`, {now})
WHERE `key` = %(key)s AND `holder` = %(holder)s AND `token` = %(token)s
"""

POSTGRESQL_LEASE_CURRENT = """
SELECT "key", "holder", "token", "expires_at" FROM {lease}
WHERE "key" = %(key)s AND "expires_at" > {now}
"""
SQLITE_LEASE_CURRENT = POSTGRESQL_LEASE_CURRENT
MYSQL_LEASE_CURRENT = """
SELECT `key`, `holder`, `token`, `expires_at` FROM {lease}
WHERE `key` = %(key)s AND `expires_at` > {now}
"""

DB_NOW = "SELECT {now}"

# ---------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------

Variants = dict[str, "str | tuple[str, ...]"]

STATEMENTS: dict[str, Variants] = {
    "lease_acquire": {
        "postgresql": POSTGRESQL_LEASE_ACQUIRE,
        "sqlite": SQLITE_LEASE_ACQUIRE,
        "mysql": MYSQL_LEASE_ACQUIRE,
        "mariadb": MARIADB_LEASE_ACQUIRE,
    },
    "lease_refresh": {
        "postgresql": POSTGRESQL_LEASE_REFRESH,
        "sqlite": SQLITE_LEASE_REFRESH,
        "mysql": MYSQL_LEASE_REFRESH,
    },
    "lease_release": {
        "postgresql": POSTGRESQL_LEASE_RELEASE,
        "sqlite": SQLITE_LEASE_RELEASE,
        "mysql": MYSQL_LEASE_RELEASE,
    },
    "lease_current": {
        "postgresql": POSTGRESQL_LEASE_CURRENT,
        "sqlite": SQLITE_LEASE_CURRENT,
        "mysql": MYSQL_LEASE_CURRENT,
    },
    "db_now": {"postgresql": DB_NOW, "sqlite": DB_NOW, "mysql": DB_NOW},
}

_NOW = {"postgresql": POSTGRESQL_NOW_MS, "sqlite": SQLITE_NOW_MS, "mysql": MYSQL_NOW_MS}


def variant(connection: BaseDatabaseWrapper) -> str:
    """``postgresql``, ``sqlite``, ``mysql`` or ``mariadb``; anything else is refused."""
    vendor = connection.vendor
    if vendor == "mysql" and connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        return "mariadb"
    if vendor in _NOW:
        return vendor
    raise NotSupportedError(f"pikku_django supports PostgreSQL, MySQL/MariaDB and SQLite, not {vendor!r}.")


def statements(name: str, connection: BaseDatabaseWrapper, *, portable: bool = False) -> tuple[str, ...]:
    """
    The statements of ``name`` for this connection, with the clock and table
    names filled in: one, except where a vendor needs more (MySQL's acquire).
    ``portable=True`` takes the MySQL form on MariaDB too (tests prove both
    forms there).
    """
    which = variant(connection)
    if portable and which == "mariadb":
        which = "mysql"
    rendered = _render(name, which)
    return rendered if isinstance(rendered, tuple) else (rendered,)


def statement(name: str, connection: BaseDatabaseWrapper) -> str:
    """The one statement ``name`` for this connection."""
    (text,) = statements(name, connection)
    return text


#: Now as a datetime, for the DateTimeFields (see ``clock.DbNow``). SQLite
#: takes it as the ``now_dt`` parameter, which ``now_params()`` supplies.
_NOW_DT = {"postgresql": "clock_timestamp()", "sqlite": "%(now_dt)s", "mysql": "UTC_TIMESTAMP(6)"}


@functools.cache
def _render(name: str, which: str) -> str | tuple[str, ...]:
    from pikku_django.models import Lease, LeaseTokenFloor, WorkflowRun, WorkflowStep, WorkflowStepAttempt

    variants = STATEMENTS[name]
    template = variants.get(which) or variants["mysql"]
    vendor = "mysql" if which == "mariadb" else which
    quote = "`{}`" if vendor == "mysql" else '"{}"'
    fill = {
        "now": _NOW[vendor],
        "now_dt": _NOW_DT[vendor],
        "lease": quote.format(Lease._meta.db_table),
        "floor": quote.format(LeaseTokenFloor._meta.db_table),
        "run": quote.format(WorkflowRun._meta.db_table),
        "step": quote.format(WorkflowStep._meta.db_table),
        "attempt": quote.format(WorkflowStepAttempt._meta.db_table),
    }
    if isinstance(template, tuple):
        return tuple(part.format(**fill) for part in template)
    return template.format(**fill)


#: The collation that makes key and holder columns compare byte for byte.
#: MySQL/MariaDB's default collations fold case and pad spaces, which would
#: make "Report:1" and "report:1 " one key and one holder; the NO PAD binary
#: collations do neither. PostgreSQL and SQLite already compare exactly.
EXACT_COLLATIONS = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}


def exact_collation(connection: BaseDatabaseWrapper) -> str | None:
    """The byte-for-byte collation for this connection, or None where it is the default."""
    return EXACT_COLLATIONS.get(variant(connection))


def exact_char_type(connection: BaseDatabaseWrapper, max_length: int) -> str | None:
    """
    The column type of an exact string column, or None for Django's own. On
    MySQL/MariaDB the character set is spelled out, since the collation above
    belongs to utf8mb4 whatever the database's default character set is.
    """
    if connection.vendor == "mysql":
        return f"varchar({max_length}) CHARACTER SET utf8mb4"
    return None


# ---------------------------------------------------------------------------
# Workflow steps
# ---------------------------------------------------------------------------

#: The claim's guard, the same on every vendor. It matches a step that is
#: pending or scheduled (its attempt was counted when it was scheduled), or
#: failed or running under a *lapsed* lease with attempts left (a new
#: attempt). A live lease, a NULL lease (parked on a child run), a success, or
#: a spent budget match nothing. ``rpc_name`` is part of the guard, so a claim
#: with another function changes nothing (the manager then says why).
_STEP_CLAIM_GUARD = """
    s.{q}run_id{q} = %(run_id)s AND s.{q}step_name{q} = %(step_name)s AND s.{q}rpc_name{q} = %(rpc_name)s
    AND (
        s.{q}status{q} IN ('pending', 'scheduled')
        OR (s.{q}status{q} = 'failed' AND s.{q}attempt{q} < s.{q}retries{q} + 1)
        OR (s.{q}status{q} = 'running' AND s.{q}lease_expires_at{q} <= {now_ms}
            AND s.{q}attempt{q} < s.{q}retries{q} + 1)
    )
"""

#: The attempt number is advanced by the same guarded UPDATE that grants the
#: lease, so the worker it is taken from is fenced out at once: every write of
#: an attempt is guarded by ``attempt = its number AND status = 'running'``.
#: ``attempt`` is assigned first: MySQL evaluates SET left to right, and it must
#: read the old status.
_STEP_CLAIM_SET = """
    {q}attempt{q} = CASE WHEN s.{q}status{q} IN ('pending', 'scheduled')
        THEN s.{q}attempt{q} ELSE s.{q}attempt{q} + 1 END,
    {q}status{q} = 'running',
    {q}lease_expires_at{q} = {now_ms} + %(lease_ms)s,
    {q}result{q} = NULL,
    {q}error{q} = NULL,
    {q}updated_at{q} = {now_dt}
"""

#: One round trip: the guarded UPDATE and the attempt's history row in one
#: statement (a data-modifying CTE is atomic with the statement around it).
POSTGRESQL_STEP_CLAIM = (
    """
WITH clock AS (SELECT {now} AS now_ms),
claimed AS (
    UPDATE {step} AS s SET"""
    + _STEP_CLAIM_SET.replace("{now_ms}", "clock.now_ms").replace("{q}", '"')
    + """    FROM clock WHERE"""
    + _STEP_CLAIM_GUARD.replace("{now_ms}", "clock.now_ms").replace("{q}", '"')
    + """    RETURNING s.*
),
history AS (
    INSERT INTO {attempt} ("step_id", "attempt", "status", "created_at", "running_at")
    SELECT "id", "attempt", 'running', {now_dt}, {now_dt} FROM claimed
    ON CONFLICT ("step_id", "attempt")
    DO UPDATE SET "status" = 'running', "running_at" = EXCLUDED."running_at"
)
SELECT * FROM claimed
"""
)

SQLITE_STEP_CLAIM = (
    """
UPDATE {step} AS s SET"""
    + _STEP_CLAIM_SET.replace("{now_ms}", "{now}").replace("{q}", '"')
    + """WHERE"""
    + _STEP_CLAIM_GUARD.replace("{now_ms}", "{now}").replace("{q}", '"')
    + """RETURNING *
"""
)

#: MySQL/MariaDB have no UPDATE ... RETURNING: the row count (rows matched,
#: CLIENT.FOUND_ROWS) says whether the guard matched, and the manager reads
#: the step back inside the same transaction, under the row lock it holds.
MYSQL_STEP_CLAIM = (
    """
UPDATE {step} AS s SET"""
    + _STEP_CLAIM_SET.replace("{now_ms}", "{now}").replace("{q}", "`")
    + """WHERE"""
    + _STEP_CLAIM_GUARD.replace("{now_ms}", "{now}").replace("{q}", "`")
)

#: The claimed attempt's history row: created for a new attempt, moved to
#: running for one counted before (pending, scheduled).
SQLITE_STEP_CLAIM_HISTORY = """
INSERT INTO {attempt} ("step_id", "attempt", "status", "created_at", "running_at")
VALUES (%(step_id)s, %(attempt)s, 'running', {now_dt}, {now_dt})
ON CONFLICT ("step_id", "attempt") DO UPDATE SET "status" = 'running', "running_at" = excluded."running_at"
"""

MYSQL_STEP_CLAIM_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `created_at`, `running_at`)
VALUES (%(step_id)s, %(attempt)s, 'running', {now_dt}, {now_dt})
ON DUPLICATE KEY UPDATE `status` = 'running', `running_at` = {now_dt}
"""

STATEMENTS.update(
    {
        "step_claim": {
            "postgresql": POSTGRESQL_STEP_CLAIM,
            "sqlite": SQLITE_STEP_CLAIM,
            "mysql": MYSQL_STEP_CLAIM,
        },
        "step_claim_history": {
            "sqlite": SQLITE_STEP_CLAIM_HISTORY,
            "mysql": MYSQL_STEP_CLAIM_HISTORY,
        },
    }
)
