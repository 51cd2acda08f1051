"""
The runtime's step path: a new step inserted already claimed, an attempt
claimed, an attempt's outcome recorded. Each is one commit that writes the
step and its attempt's history row together; on PostgreSQL each is one
statement (a data-modifying CTE is atomic with the statement around it).
"""

from __future__ import annotations

from pikku_django.sql.steps import MYSQL_STEP_CLAIM, POSTGRESQL_STEP_CLAIM, SQLITE_STEP_CLAIM

#: The guard every start carries: the run is still active (not cancelled or
#: ended elsewhere) and not past its deadline, judged in the same statement,
#: so a step of a run that was cancelled or timed out is never started (the
#: pass then finds out why and stops). ``{now_ms}`` is the statement's now.
#: With a run lease given (``managers.fence.RunFence``), the start is also
#: fenced to it: only while that lease is still this holder's and token's and
#: live is the step inserted, so a pass that lost its run lease starts nothing.
_RUN_ACTIVE = """
    EXISTS (SELECT 1 FROM {run} r WHERE r.{q}id{q} = %(run_id)s{uuid}
        AND r.{q}status{q} IN ('running', 'suspended')
        AND (r.{q}deadline_at{q} IS NULL OR r.{q}deadline_at{q} > {now_ms}))
    AND (%(lease_key)s{text} IS NULL OR EXISTS (SELECT 1 FROM {lease} l
        WHERE l.{q}key{q} = %(lease_key)s{text} AND l.{q}holder{q} = %(lease_holder)s{text}
        AND l.{q}token{q} = %(lease_token)s{int} AND l.{q}expires_at{q} > {now_ms}))
"""

#: A step run for the first time is inserted running, attempt 1, under its
#: lease, with its attempt row, while its run is active (``_RUN_ACTIVE``).
#: ``ON CONFLICT DO NOTHING``: a step that exists already (another pass
#: inserted it after this pass read the run's steps) returns no row, and the
#: caller claims it through the guarded claim instead. Every parameter is
#: typed, so the statement is the same under either binding.
POSTGRESQL_STEP_START = (
    """
WITH clock AS (SELECT {now} AS now_ms, clock_timestamp() AS now_dt),
inserted AS (
    INSERT INTO {step} ("id", "run_id", "step_name", "rpc_name", "data", "status", "retries",
        "retry_delay", "worker_losses", "attempt", "lease_expires_at", "created_at", "updated_at")
    SELECT %(step_id)s::uuid, %(run_id)s::uuid, %(step_name)s::varchar, %(rpc_name)s::varchar,
        %(data)s::jsonb, 'running', %(retries)s::integer, %(retry_delay)s::integer,
        %(worker_losses)s::integer, 1,
        clock.now_ms + %(lease_ms)s::bigint, clock.now_dt, clock.now_dt
    FROM clock
    WHERE"""
    + _RUN_ACTIVE.replace("{q}", '"')
    .replace("{uuid}", "::uuid")
    .replace("{text}", "::varchar")
    .replace("{int}", "::bigint")
    .replace("{now_ms}", "clock.now_ms")
    + """    ON CONFLICT ("run_id", "step_name") DO NOTHING
    RETURNING "id", "updated_at"
),
history AS (
    INSERT INTO {attempt} ("step_id", "attempt", "status", "holder", "created_at", "running_at")
    SELECT "id", 1, 'running', %(holder)s::varchar, "updated_at", "updated_at" FROM inserted
)
SELECT "id" FROM inserted
"""
)

#: SQLite and MySQL/MariaDB: the step row, then its history row
#: (``step_claim_history``), in one transaction.
SQLITE_STEP_START = (
    """
INSERT INTO {step} ("id", "run_id", "step_name", "rpc_name", "data", "status", "retries",
    "retry_delay", "worker_losses", "attempt", "lease_expires_at", "created_at", "updated_at")
SELECT %(step_id)s, %(run_id)s, %(step_name)s, %(rpc_name)s, %(data)s, 'running', %(retries)s,
    %(retry_delay)s, %(worker_losses)s, 1, {now} + %(lease_ms)s, {now_dt}, {now_dt}
WHERE"""
    + _RUN_ACTIVE.replace("{q}", '"')
    .replace("{uuid}", "")
    .replace("{text}", "")
    .replace("{int}", "")
    .replace("{now_ms}", "{now}")
    + """ON CONFLICT ("run_id", "step_name") DO NOTHING
RETURNING "id"
"""
)

#: A duplicate (run, step name) raises IntegrityError, which rolls back only
#: this statement; the caller rolls the transaction back and claims instead.
#: A run no longer active inserts no row, and then no history row either
#: (``MYSQL_STEP_START_HISTORY`` copies the step row just inserted).
MYSQL_STEP_START = """
INSERT INTO {step} (`id`, `run_id`, `step_name`, `rpc_name`, `data`, `status`, `retries`,
    `retry_delay`, `worker_losses`, `attempt`, `lease_expires_at`, `created_at`, `updated_at`)
SELECT %(step_id)s, %(run_id)s, %(step_name)s, %(rpc_name)s, %(data)s, 'running', %(retries)s,
    %(retry_delay)s, %(worker_losses)s, 1, {now} + %(lease_ms)s, {now_dt}, {now_dt}
FROM DUAL WHERE""" + (
    _RUN_ACTIVE.replace("{q}", "`")
    .replace("{uuid}", "")
    .replace("{text}", "")
    .replace("{int}", "")
    .replace("{now_ms}", "{now}")
)

MYSQL_STEP_START_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `holder`, `created_at`, `running_at`)
SELECT s.`id`, 1, 'running', %(holder)s, s.`created_at`, s.`created_at` FROM {step} AS s
WHERE s.`id` = %(step_id)s
"""

#: The guarded claim (``sql.steps``), answering only what the runtime needs:
#: the attempt it now runs. The guard and the history row are unchanged.
POSTGRESQL_STEP_CLAIM_ATTEMPT = POSTGRESQL_STEP_CLAIM.replace(
    "SELECT * FROM claimed", 'SELECT "attempt" FROM claimed'
)
assert POSTGRESQL_STEP_CLAIM_ATTEMPT != POSTGRESQL_STEP_CLAIM

SQLITE_STEP_CLAIM_ATTEMPT = SQLITE_STEP_CLAIM.replace("RETURNING *", 'RETURNING "id", "attempt"')
assert SQLITE_STEP_CLAIM_ATTEMPT != SQLITE_STEP_CLAIM

#: No UPDATE ... RETURNING: the attempt now run travels back through
#: LAST_INSERT_ID(expr) (the client's insert id, no second statement), and the
#: row count (rows matched, CLIENT.FOUND_ROWS) says whether the guard matched,
#: as in ``sql.MYSQL_LEASE_REFRESH``.
_MYSQL_ATTEMPT_SET = (
    "`attempt` = CASE WHEN s.`status` IN ('pending', 'scheduled')\n"
    "        THEN s.`attempt` ELSE s.`attempt` + 1 END,"
)
MYSQL_STEP_CLAIM_ATTEMPT = MYSQL_STEP_CLAIM.replace(
    _MYSQL_ATTEMPT_SET,
    "`attempt` = LAST_INSERT_ID(CASE WHEN s.`status` IN ('pending', 'scheduled')\n"
    "        THEN s.`attempt` ELSE s.`attempt` + 1 END),",
)
assert MYSQL_STEP_CLAIM_ATTEMPT != MYSQL_STEP_CLAIM

#: The claimed attempt's history row, taken from the step row this
#: transaction has just claimed and still holds locked. It is sent in the same
#: round trip as the claim (see ``MYSQL_MARK``), so it writes only when the
#: claim's LAST_INSERT_ID carries the attempt it claimed. Its ``running_at``
#: is the step's ``updated_at`` as the claim wrote it, to the microsecond.
MYSQL_STEP_CLAIM_ATTEMPT_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `holder`, `created_at`, `running_at`)
SELECT s.`id`, s.`attempt`, 'running', %(holder)s, s.`updated_at`, s.`updated_at` FROM {step} AS s
WHERE s.`run_id` = %(run_id)s AND s.`step_name` = %(step_name)s AND s.`status` = 'running'
    AND s.`attempt` = LAST_INSERT_ID()
ON DUPLICATE KEY UPDATE {attempt}.`status` = 'running', {attempt}.`holder` = %(holder)s,
    {attempt}.`running_at` = s.`updated_at`
"""

#: The step as the claim left it, read in the claim's own round trip, under
#: the row lock the claim holds: a row only when the claim matched.
MYSQL_STEP_CLAIMED = """
SELECT {step_columns} FROM {step}
WHERE `run_id` = %(run_id)s AND `step_name` = %(step_name)s AND `status` = 'running'
    AND `attempt` = LAST_INSERT_ID()
"""

#: MySQL/MariaDB send a step write's statements in one round trip (mysqlclient
#: enables multi-statements): ``START TRANSACTION``, the guarded write, its
#: history row, ``COMMIT``. The history row cannot wait for the client to read
#: the guard's outcome, so the guard leaves it in LAST_INSERT_ID, reset here
#: first (0 is no attempt), and the history statement writes only on a match.
MYSQL_MARK = "DO LAST_INSERT_ID(0)"


#: A failure that allows no other attempt (``final``: a ``NonRetryableError``,
#: an error outside ``retry_on``, a backoff that answered None) spends the
#: step's budget: ``retries`` becomes what makes this attempt its last (see
#: ``WorkflowStep.is_exhausted``), computed from the row itself (only
#: additions are compared first: the columns are unsigned on MySQL). Any
#: other outcome keeps ``retries``; ``next_delay`` (a backoff's delay before
#: the next attempt) replaces ``retry_delay`` when given.
def _spent(q: str, cast: str) -> str:
    losses = f"CASE WHEN {q}worker_losses{q} IS NULL THEN 0 ELSE {q}losses{q} END"
    return (
        f"CASE WHEN %(final)s{cast} AND {q}attempt{q} >= {q}budget_base{q} + 1 + {losses}\n"
        f"        THEN {q}attempt{q} - {q}budget_base{q} - 1 - {losses} ELSE {q}retries{q} END"
    )


#: An attempt's outcome, fenced to it: only while the step is still running
#: as this attempt does the UPDATE match, and only then is the history row
#: written (from the UPDATE's own RETURNING). A superseded attempt returns no
#: row and changes nothing. JSON travels as text, cast once.
POSTGRESQL_STEP_FINISH = """
WITH finished AS (
    UPDATE {step} SET "status" = %(status)s::varchar, "result" = %(result)s::jsonb,
        "error" = %(error)s::jsonb, "lease_expires_at" = NULL, "updated_at" = clock_timestamp(),
        "retry_delay" = COALESCE(%(next_delay)s::integer, "retry_delay"),
        "retries" = {spent}
    WHERE "id" = %(step_id)s::uuid AND "status" = 'running' AND "attempt" = %(attempt)s::integer
    RETURNING "id", "attempt", "status", "result", "error", "updated_at"
),
history AS (
    INSERT INTO {attempt} AS a ("step_id", "attempt", "status", "result", "error", "created_at",
        "succeeded_at", "failed_at")
    SELECT "id", "attempt", "status", "result", "error", "updated_at",
        CASE WHEN "status" = 'succeeded' THEN "updated_at" END,
        CASE WHEN "status" = 'failed' THEN "updated_at" END
    FROM finished
    ON CONFLICT ("step_id", "attempt") DO UPDATE SET "status" = EXCLUDED."status",
        "result" = EXCLUDED."result", "error" = EXCLUDED."error",
        "succeeded_at" = COALESCE(EXCLUDED."succeeded_at", a."succeeded_at"),
        "failed_at" = COALESCE(EXCLUDED."failed_at", a."failed_at")
)
SELECT "id" FROM finished
"""

#: SQLite and MySQL/MariaDB: the fenced UPDATE (its row count decides), then
#: the history row (``step_finish_history``), in one transaction.
SQLITE_STEP_FINISH = """
UPDATE {step} SET "status" = %(status)s, "result" = %(result)s, "error" = %(error)s,
    "lease_expires_at" = NULL, "updated_at" = {now_dt},
    "retry_delay" = COALESCE(%(next_delay)s, "retry_delay"), "retries" = {spent}
WHERE "id" = %(step_id)s AND "status" = 'running' AND "attempt" = %(attempt)s
"""

MYSQL_STEP_FINISH = """
UPDATE {step} SET `retry_delay` = COALESCE(%(next_delay)s, `retry_delay`), `retries` = {spent},
    `status` = %(status)s, `result` = %(result)s, `error` = %(error)s,
    `lease_expires_at` = NULL, `updated_at` = {now_dt}, `attempt` = LAST_INSERT_ID(`attempt`)
WHERE `id` = %(step_id)s AND `status` = 'running' AND `attempt` = %(attempt)s
"""

POSTGRESQL_STEP_FINISH = POSTGRESQL_STEP_FINISH.replace("{spent}", _spent('"', "::boolean"))
SQLITE_STEP_FINISH = SQLITE_STEP_FINISH.replace("{spent}", _spent('"', ""))
MYSQL_STEP_FINISH = MYSQL_STEP_FINISH.replace("{spent}", _spent("`", ""))

SQLITE_STEP_FINISH_HISTORY = """
INSERT INTO {attempt} ("step_id", "attempt", "status", "result", "error", "created_at",
    "succeeded_at", "failed_at")
VALUES (%(step_id)s, %(attempt)s, %(status)s, %(result)s, %(error)s, {now_dt},
    CASE WHEN %(status)s = 'succeeded' THEN {now_dt} END, CASE WHEN %(status)s = 'failed' THEN {now_dt} END)
ON CONFLICT ("step_id", "attempt") DO UPDATE SET "status" = excluded."status",
    "result" = excluded."result", "error" = excluded."error",
    "succeeded_at" = COALESCE(excluded."succeeded_at", "succeeded_at"),
    "failed_at" = COALESCE(excluded."failed_at", "failed_at")
"""

#: Written only when the fenced UPDATE matched (its LAST_INSERT_ID, see ``MYSQL_MARK``).
MYSQL_STEP_FINISH_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `result`, `error`, `created_at`,
    `succeeded_at`, `failed_at`)
SELECT %(step_id)s, %(attempt)s, %(status)s, %(result)s, %(error)s, {now_dt},
    CASE WHEN %(status)s = 'succeeded' THEN {now_dt} END, CASE WHEN %(status)s = 'failed' THEN {now_dt} END
FROM DUAL WHERE LAST_INSERT_ID() = %(attempt)s
ON DUPLICATE KEY UPDATE `status` = VALUES(`status`), `result` = VALUES(`result`),
    `error` = VALUES(`error`), `succeeded_at` = COALESCE(VALUES(`succeeded_at`), `succeeded_at`),
    `failed_at` = COALESCE(VALUES(`failed_at`), `failed_at`)
"""

#: The held success of the step before and the start of the next one, in one
#: commit (``StepAttemptsMixin.start_step`` with an ``outcome``). The outcome
#: is the fenced write of ``*_STEP_FINISH`` on parameters of its own
#: (``done_*``), and the start is guarded by it besides its own guard: a
#: superseded attempt's outcome matches nothing, and then nothing is started
#: either. A start refused for the run's state or lease leaves the outcome
#: written on its own, as a pass that committed it first would.
_DONE = ("step_id", "attempt", "status", "result", "error", "next_delay", "final")


def done(text: str) -> str:
    """``text`` with the outcome's parameters renamed to ``done_*``."""
    for name in _DONE:
        text = text.replace(f"%({name})s", f"%(done_{name})s")
    return text


#: One statement: the outcome's UPDATE and history row, then the start's
#: INSERT (only if the UPDATE matched) and its history row; it answers whether
#: each matched.
POSTGRESQL_STEP_HANDOFF = done(POSTGRESQL_STEP_FINISH).replace(
    "history AS (", "finished_history AS ("
).replace(')\nSELECT "id" FROM finished\n', "),\n") + POSTGRESQL_STEP_START.replace(
    "\nWITH clock AS", "clock AS", 1
).replace("FROM clock\n    WHERE", "FROM clock\n    WHERE EXISTS (SELECT 1 FROM finished) AND", 1).replace(
    'SELECT "id" FROM inserted',
    "SELECT (SELECT count(*) FROM finished), (SELECT count(*) FROM inserted)",
)
assert (
    POSTGRESQL_STEP_HANDOFF.count("WITH ") == 1
    and "EXISTS (SELECT 1 FROM finished)" in POSTGRESQL_STEP_HANDOFF
)

#: MySQL/MariaDB, in one round trip (``MYSQL_MARK`` first): the outcome's
#: UPDATE leaves its attempt in LAST_INSERT_ID when it matches, and the start
#: inserts only then (the step table has no AUTO_INCREMENT column, so nothing
#: between them moves LAST_INSERT_ID). Then the start's history row, and the
#: outcome's last: an INSERT ... SELECT into the attempt table takes its
#: table's AUTO-INC lock, and the outcome's upsert locks the attempt row it
#: meets with its gap; a transaction that held that lock and then waited for
#: AUTO-INC again would deadlock with another start's history row. The
#: outcome's history row is copied from the step row this transaction has
#: just written (and holds locked), so it is written only when that UPDATE
#: matched.
MYSQL_STEP_HANDOFF_FINISH = done(MYSQL_STEP_FINISH)
MYSQL_STEP_HANDOFF_START = MYSQL_STEP_START.replace(
    "FROM DUAL WHERE", "FROM DUAL WHERE LAST_INSERT_ID() = %(done_attempt)s AND", 1
)
assert MYSQL_STEP_HANDOFF_START != MYSQL_STEP_START
MYSQL_STEP_HANDOFF_FINISH_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `result`, `error`, `created_at`,
    `succeeded_at`, `failed_at`)
SELECT s.`id`, s.`attempt`, s.`status`, s.`result`, s.`error`, {now_dt},
    CASE WHEN s.`status` = 'succeeded' THEN {now_dt} END, CASE WHEN s.`status` = 'failed' THEN {now_dt} END
FROM {step} AS s
WHERE s.`id` = %(done_step_id)s AND s.`attempt` = %(done_attempt)s AND s.`status` = %(done_status)s
ON DUPLICATE KEY UPDATE `status` = VALUES(`status`), `result` = VALUES(`result`),
    `error` = VALUES(`error`), `succeeded_at` = COALESCE(VALUES(`succeeded_at`), `succeeded_at`),
    `failed_at` = COALESCE(VALUES(`failed_at`), `failed_at`)
"""

#: What a pass checks before each step's function runs (a run cancelled or
#: past its deadline elsewhere): the run's status and deadline, and now. A
#: read, prepared like the step statements, so the check costs a round trip.
POSTGRESQL_RUN_STATE = """
SELECT "status", "deadline_at", {now} FROM {run} WHERE "id" = %(run_id)s::uuid
"""
SQLITE_RUN_STATE = """
SELECT "status", "deadline_at", {now} FROM {run} WHERE "id" = %(run_id)s
"""
MYSQL_RUN_STATE = """
SELECT `status`, `deadline_at`, {now} FROM {run} WHERE `id` = %(run_id)s
"""

#: MySQL/MariaDB open and close the transaction of a step write inside its
#: one round trip (Django's ``atomic()`` spends four: ``SET autocommit`` off,
#: then COMMIT and ``SET autocommit`` on, each its own).
TRANSACTION_BEGIN = "START TRANSACTION"
TRANSACTION_COMMIT = "COMMIT"
TRANSACTION_ROLLBACK = "ROLLBACK"

#: The runtime's step statements by name and variant (see ``sql.STATEMENTS``).
ATTEMPT_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "step_start": {
        "postgresql": POSTGRESQL_STEP_START,
        "sqlite": SQLITE_STEP_START,
        "mysql": MYSQL_STEP_START,
    },
    "step_claim_attempt": {
        "postgresql": POSTGRESQL_STEP_CLAIM_ATTEMPT,
        "sqlite": SQLITE_STEP_CLAIM_ATTEMPT,
        "mysql": MYSQL_STEP_CLAIM_ATTEMPT,
    },
    "step_start_history": {"mysql": MYSQL_STEP_START_HISTORY},
    "step_claim_attempt_history": {"mysql": MYSQL_STEP_CLAIM_ATTEMPT_HISTORY},
    "step_claimed": {"mysql": MYSQL_STEP_CLAIMED},
    "step_finish": {
        "postgresql": POSTGRESQL_STEP_FINISH,
        "sqlite": SQLITE_STEP_FINISH,
        "mysql": MYSQL_STEP_FINISH,
    },
    "step_finish_history": {"sqlite": SQLITE_STEP_FINISH_HISTORY, "mysql": MYSQL_STEP_FINISH_HISTORY},
    "step_handoff": {"postgresql": POSTGRESQL_STEP_HANDOFF},
    "step_handoff_finish": {"mysql": MYSQL_STEP_HANDOFF_FINISH},
    "step_handoff_start": {"mysql": MYSQL_STEP_HANDOFF_START},
    "step_handoff_finish_history": {"mysql": MYSQL_STEP_HANDOFF_FINISH_HISTORY},
    "run_state": {
        "postgresql": POSTGRESQL_RUN_STATE,
        "sqlite": SQLITE_RUN_STATE,
        "mysql": MYSQL_RUN_STATE,
    },
    "mark": {"mysql": MYSQL_MARK},
    "transaction_begin": {"mysql": TRANSACTION_BEGIN},
    "transaction_commit": {"mysql": TRANSACTION_COMMIT},
    "transaction_rollback": {"mysql": TRANSACTION_ROLLBACK},
}
