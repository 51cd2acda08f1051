"""
A worker's take of a due run. Lanes woken together read the same due list
and race for its first run; on PostgreSQL and MySQL/MariaDB the take skips a
run another lane is taking (``SKIP LOCKED``) instead of waiting on its row
lock, so a lane that loses writes nothing and goes on to its next candidate
(issue 14). SQLite serialises writers anyway: its take is the guarded
UPDATE alone. And the run's outcome, fenced to the run lease.
"""

from __future__ import annotations

from pikku_django.sql.notify import RESULTS_CHANNEL

#: The guarded take in one statement: the run is picked only while it is
#: active and its ``wake_at`` is the value the lane read, and only if no other
#: transaction holds its row (``SKIP LOCKED``); then its ``wake_at`` moves to
#: when the run lease would lapse and it is marked running. A skipped or
#: changed row returns nothing, locks nothing and takes no transaction id
#: (``pg_current_xact_id_if_assigned()`` stays NULL). A taken one returns the
#: run as it is now, for the pass (no read after the take).
POSTGRESQL_RUN_TAKE = """
WITH picked AS (
    SELECT "id" FROM {run}
    WHERE "id" = %(run_id)s::uuid AND "status" IN ('running', 'suspended')
        AND "wake_at" IS NOT DISTINCT FROM %(wake_at)s::bigint
        AND NOT EXISTS (SELECT 1 FROM {queue} q WHERE q."name" = {run}."queue" AND q."paused")
    FOR UPDATE OF {run} SKIP LOCKED
)
UPDATE {run} AS r SET "wake_at" = {now} + %(ttl_ms)s::bigint, "status" = 'running'
FROM picked WHERE r."id" = picked."id"
RETURNING r.*
"""

#: Every take is guarded on its run's queue not being paused
#: (``WorkflowQueue.paused``), in the take's own statement: no pass of a
#: paused queue starts once the pause has committed, and a worker pays no
#: statement of its own for it.
#:
#: MySQL/MariaDB cannot skip a locked row in an UPDATE, and have no
#: RETURNING: the take locks the run under the same guard (``<=>`` is the
#: null-safe equality) into a session variable, skipping a row another lane
#: holds (the variable stays NULL), moves only the run it got, and reads it
#: back, in one round trip (``drivers.MySQLDriver.take_run``). A skipped run
#: makes the UPDATE match nothing at once (``id = NULL``), without waiting.
MYSQL_RUN_TAKE_RESET = "SET @pikku_take = NULL"
MYSQL_RUN_TAKE_LOCK = """
SELECT `id` INTO @pikku_take FROM {run}
WHERE `id` = %(run_id)s AND `status` IN ('running', 'suspended') AND `wake_at` <=> %(wake_at)s
    AND NOT EXISTS (SELECT 1 FROM {queue} q WHERE q.`name` = {run}.`queue` AND q.`paused`)
FOR UPDATE SKIP LOCKED
"""
MYSQL_RUN_TAKE_MOVE = """
UPDATE {run} SET `wake_at` = {now} + %(ttl_ms)s, `status` = 'running'
WHERE `id` = @pikku_take AND `status` IN ('running', 'suspended') AND `wake_at` <=> %(wake_at)s
"""

#: SQLite's take: the same guard (``IS`` is the null-safe equality), and
#: the run as it is now, for the pass (no read after the take).
SQLITE_RUN_TAKE = """
UPDATE {run} SET "wake_at" = {now} + %(ttl_ms)s, "status" = 'running'
WHERE "id" = %(run_id)s AND "status" IN ('running', 'suspended') AND "wake_at" IS %(wake_at)s
    AND NOT EXISTS (SELECT 1 FROM {queue} q WHERE q."name" = {run}."queue" AND q."paused")
RETURNING *
"""

#: MySQL/MariaDB: the run as the take left it, in the take's round trip.
MYSQL_RUN_TAKEN = "SELECT * FROM {run} WHERE `id` = @pikku_take"

#: MariaDB: the take's run lease, in the take's round trip. The acquire's
#: upsert (``sql.leases.MYSQL_LEASE_UPSERT``, with the same guards) as an
#: INSERT ... SELECT that inserts nothing unless the take got the run
#: (``@pikku_take``), returning the row as it left it: the lease is the
#: take's when the row's holder is. (MySQL 8 has no RETURNING: its take
#: acquires the lease with a statement of its own.)
MARIADB_RUN_TAKE_LEASE = """
INSERT INTO {lease} (`key`, `holder`, `token`, `expires_at`)
SELECT %(key)s, %(holder)s, COALESCE((SELECT `token` FROM {floor} WHERE `id` = 1), 0) + 1,
    {now} + %(ttl_ms)s
FROM DUAL WHERE @pikku_take IS NOT NULL
ON DUPLICATE KEY UPDATE
    `token` = IF(`expires_at` <= {now}, `token` + 1, `token`),
    `holder` = IF(`expires_at` <= {now}, %(holder)s, `holder`),
    `expires_at` = IF(`holder` = %(holder)s, {now} + %(ttl_ms)s, `expires_at`)
RETURNING `key`, `holder`, `token`, `expires_at`
"""

#: When a run was last written: an ended run's end, for its task's result.
_RUN_UPDATED_AT = "SELECT {q}id{q}, {q}updated_at{q} FROM {run} WHERE {q}id{q} = %(run_id)s{uuid}"

#: A top-level run's outcome, fenced to the pass's run lease (``managers.fence``;
#: a NULL ``lease_key`` is a write outside a pass): only while the run is
#: still active and the lease still this holder's and token's and live does it
#: end. ``{sets}``: the outcome's columns (``run_outcome``); ``{tail}``: what
#: follows the guard. Where the vendor can, it returns the end it stored
#: (``updated_at``): a task's ``task_finished`` reports it with no read after
#: the commit.
_RUN_FINISH = """
UPDATE {run} SET {q}status{q} = %(status)s{text}, {q}wake_at{q} = NULL, {q}updated_at{q} = {now_dt}{sets}
WHERE {q}id{q} = %(run_id)s{uuid} AND {q}status{q} IN ('running', 'suspended')
    AND (%(lease_key)s{text} IS NULL OR EXISTS (SELECT 1 FROM {lease} l
        WHERE l.{q}key{q} = %(lease_key)s{text} AND l.{q}holder{q} = %(lease_holder)s{text}
        AND l.{q}token{q} = %(lease_token)s{int} AND l.{q}expires_at{q} > {now}))
{tail}"""

RETURNING_END = 'RETURNING "updated_at"\n'
TYPED = {"q": '"', "uuid": "::uuid", "text": "::varchar", "int": "::bigint", "json": "::jsonb"}
UNTYPED = {"uuid": "", "text": "", "int": "", "json": ""}


def run_finish(columns: tuple[str, ...], **marks: str) -> str:
    """``_RUN_FINISH`` setting ``columns`` (JSON parameters of the same names), in one vendor's form."""
    sets = "".join(f", {{q}}{column}{{q}} = %({column})s{{json}}" for column in columns)
    text = _RUN_FINISH.replace("{sets}", sets)
    for mark, value in marks.items():
        text = text.replace("{" + mark + "}", value)
    return text


#: PostgreSQL: the run's readers hear its end from the committing
#: transaction (``sql.notify.RESULTS_CHANNEL``), told in the same statement:
#: no round trip more for a run's end.
NOTIFY_RESULTS = f"(SELECT pg_notify('{RESULTS_CHANNEL}', %(run_id)s::uuid::text)) AS notice"


def postgresql_run_end(columns: tuple[str, ...]) -> str:
    """A top-level run's outcome on PostgreSQL, its end returned and its readers notified."""
    update = run_finish(columns, **TYPED, tail=RETURNING_END).strip("\n")
    return f'WITH ended AS ({update})\nSELECT ended."updated_at" FROM ended, LATERAL {NOTIFY_RESULTS}\n'


#: The outcome statements by the columns they set, sorted: a completion's
#: error and output, a failure's error.
RUN_OUTCOMES = {("error", "output"): "run_complete", ("error",): "run_fail"}

#: The take statements by name and variant (see ``sql.STATEMENTS``).
RUN_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "run_take": {"postgresql": POSTGRESQL_RUN_TAKE, "sqlite": SQLITE_RUN_TAKE},
    "run_take_reset": {"mysql": MYSQL_RUN_TAKE_RESET},
    "run_take_lock": {"mysql": MYSQL_RUN_TAKE_LOCK},
    "run_take_move": {"mysql": MYSQL_RUN_TAKE_MOVE},
    "run_taken": {"mysql": MYSQL_RUN_TAKEN},
    "run_take_lease": {"mariadb": MARIADB_RUN_TAKE_LEASE},
    "run_updated_at": {
        "postgresql": _RUN_UPDATED_AT.replace("{q}", '"').replace("{uuid}", "::uuid"),
        "sqlite": _RUN_UPDATED_AT.replace("{q}", '"').replace("{uuid}", ""),
        "mysql": _RUN_UPDATED_AT.replace("{q}", "`").replace("{uuid}", ""),
    },
    **{
        name: {
            "postgresql": postgresql_run_end(columns),
            "sqlite": run_finish(columns, q='"', **UNTYPED, tail=RETURNING_END),
            "mysql": run_finish(columns, q="`", **UNTYPED, tail=""),
        }
        for columns, name in RUN_OUTCOMES.items()
    },
}
