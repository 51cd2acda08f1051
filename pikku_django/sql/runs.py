"""
A worker's take of a due run. Lanes woken together read the same due list
and race for its first run; on PostgreSQL and MySQL/MariaDB the take skips a
run another lane is taking (``SKIP LOCKED``) instead of waiting on its row
lock, so a lane that loses writes nothing and goes on to its next candidate
(issue 14). SQLite serialises writers anyway: its take stays the guarded
UPDATE of the ORM (``managers.passes``).
"""

from __future__ import annotations

#: The guarded take in one statement: the run is picked only while it is
#: active and its ``wake_at`` is the value the lane read, and only if no other
#: transaction holds its row (``SKIP LOCKED``); then its ``wake_at`` moves to
#: when the run lease would lapse and it is marked running. A skipped or
#: changed row returns nothing, locks nothing and takes no transaction id
#: (``pg_current_xact_id_if_assigned()`` stays NULL).
POSTGRESQL_RUN_TAKE = """
WITH picked AS (
    SELECT "id" FROM {run}
    WHERE "id" = %(run_id)s::uuid AND "status" IN ('running', 'suspended')
        AND "wake_at" IS NOT DISTINCT FROM %(wake_at)s::bigint
    FOR UPDATE SKIP LOCKED
)
UPDATE {run} AS r SET "wake_at" = {now} + %(ttl_ms)s::bigint, "status" = 'running'
FROM picked WHERE r."id" = picked."id"
RETURNING r."id"
"""

#: MySQL/MariaDB cannot skip a locked row in an UPDATE: the take first locks
#: the run under the same guard (``<=>`` is the null-safe equality), skipping
#: a row another lane holds, and updates it only if it got it.
MYSQL_RUN_TAKE_LOCK = """
SELECT `id` FROM {run}
WHERE `id` = %(run_id)s AND `status` IN ('running', 'suspended') AND `wake_at` <=> %(wake_at)s
FOR UPDATE SKIP LOCKED
"""

#: The take statements by name and variant (see ``sql.STATEMENTS``).
RUN_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "run_take": {"postgresql": POSTGRESQL_RUN_TAKE},
    "run_take_lock": {"mysql": MYSQL_RUN_TAKE_LOCK},
}
