"""
A pass's end in one statement (PostgreSQL) or one round trip (MySQL/MariaDB):
the last step's outcome, fenced to its attempt; the run's outcome, fenced to
the run lease and written only when that step's outcome was; and the run
lease's release. The outcome a lane holds for its next take is written so
(``managers.passes.HeldFinish``), ahead of that take in its transaction.

Each write keeps the guard it has alone: the step's outcome its attempt, the
run's its lease (judged before the release, in the same statement's
snapshot on PostgreSQL, and before the release statement on MySQL), the
release its holder and token. The step's parameters are renamed ``done_*``
(as in the step handoff); the run's and the lease's keep their names. SQLite
sends its statements one by one anyway, and keeps them apart.
"""

from __future__ import annotations

from pikku_django.sql.attempts import MYSQL_STEP_FINISH_HISTORY, POSTGRESQL_STEP_FINISH, done
from pikku_django.sql.notify import RESULTS_CHANNEL
from pikku_django.sql.runs import RETURNING_END, RUN_OUTCOMES, TYPED, UNTYPED, run_finish

#: The step's outcome (``finished``, its history row beside it), the run's
#: (``ended``, only if ``finished`` matched; its readers notified, ``notified``)
#: and the release (``released``):
#: one row, which says what each matched, and the end the run's outcome stored.
_POSTGRESQL_STEP_PART = done(POSTGRESQL_STEP_FINISH).replace(')\nSELECT "id" FROM finished\n', "),\n")
assert done(POSTGRESQL_STEP_FINISH) != _POSTGRESQL_STEP_PART

_POSTGRESQL_REST = """ended AS (
{run}),
released AS (
    UPDATE {lease} SET "expires_at" = LEAST("expires_at", clock.now_ms)
    FROM (SELECT {now} AS now_ms) AS clock
    WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
        AND "expires_at" > clock.now_ms
    RETURNING 1
),
notified AS (
    SELECT pg_notify('{channel}', %(run_id)s::uuid::text) FROM ended
)
SELECT (SELECT count(*) FROM finished) AS "finished", (SELECT count(*) FROM released) AS "released",
    (SELECT "updated_at" FROM ended) AS "updated_at"
FROM (SELECT count(*) FROM notified) AS notice
"""


def _postgresql(columns: tuple[str, ...]) -> str:
    run = run_finish(columns, **TYPED, tail="    AND EXISTS (SELECT 1 FROM finished)\n    " + RETURNING_END)
    rest = _POSTGRESQL_REST.replace("{run}", run.strip("\n") + "\n").replace("{channel}", RESULTS_CHANNEL)
    return _POSTGRESQL_STEP_PART + rest


#: MySQL/MariaDB, in one round trip (``MYSQL_MARK``, the step's outcome as
#: in the handoff, ``step_handoff_finish``, then these): the step's outcome
#: leaves its attempt in LAST_INSERT_ID when it matches, and the run's
#: outcome is guarded by it (neither that UPDATE, the read of its end nor
#: the release moves LAST_INSERT_ID); then the release, and the step's
#: history row last, as in the handoff (an INSERT ... SELECT into the attempt
#: table takes that table's AUTO-INC lock).
def _mysql(columns: tuple[str, ...]) -> str:
    return run_finish(columns, q="`", **UNTYPED, tail="    AND LAST_INSERT_ID() = %(done_attempt)s\n")


#: MySQL/MariaDB have no RETURNING: the end the run's outcome stored is read
#: in the outcome's own round trip, right after it, and only if it matched
#: (``ROW_COUNT()`` is the rows the UPDATE before it matched).
MYSQL_RUN_END_READ = "SELECT `updated_at` FROM {run} WHERE `id` = %(run_id)s AND ROW_COUNT() > 0"


#: ``pass_end_run_complete`` and ``pass_end_run_fail``, by the run outcome's
#: statement (``sql.runs.RUN_OUTCOMES``), and MySQL's history row.
END_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    **{
        f"pass_end_{name}": {"postgresql": _postgresql(columns), "mysql": _mysql(columns)}
        for columns, name in RUN_OUTCOMES.items()
    },
    "pass_end_finish_history": {"mysql": done(MYSQL_STEP_FINISH_HISTORY)},
    "run_end_read": {"mysql": MYSQL_RUN_END_READ},
}
