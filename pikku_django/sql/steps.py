"""The step statements: the guarded claim and its attempt-history row."""

from __future__ import annotations

#: The claim's guard, the same on every vendor. It matches a step that is
#: pending or scheduled (its attempt was counted when it was scheduled), or
#: failed or running under a *lapsed* lease with attempts left (a new
#: attempt). A live lease, a NULL lease (parked on a child run), a success, or
#: a spent budget match nothing. The budget is ``retries + 1`` attempts after
#: the ``budget_base`` attempts spent before it (a ``retry_workflow`` raises
#: the base, so the attempt number keeps rising and every older attempt stays
#: fenced). A task's step has a worker-loss budget besides (``worker_losses``
#: not NULL): a lost worker is judged on ``losses`` alone, only attempts that
#: raised count against ``retries`` (no subtraction: the columns are unsigned
#: on MySQL), and a step failed by one loss too many (``losses`` over the
#: budget) is never claimed again. ``rpc_name`` is part of the guard, so a claim
#: with another function changes nothing (the manager then says why). A
#: running step under a lapsed lease whose attempt a take claimed
#: (``provisional``) is always claimed (given back, see ``_STEP_CLAIM_SET``),
#: but never by a take (``by_take``): the pass that runs it claims it.
_STEP_CLAIM_GUARD = """
    s.{q}run_id{q} = %(run_id)s AND s.{q}step_name{q} = %(step_name)s AND s.{q}rpc_name{q} = %(rpc_name)s
    AND (
        s.{q}status{q} IN ('pending', 'scheduled')
        OR (s.{q}status{q} = 'failed' AND s.{q}attempt{q} < s.{q}budget_base{q} + s.{q}retries{q} + 1
            + CASE WHEN s.{q}worker_losses{q} IS NULL THEN 0 ELSE s.{q}losses{q} END
            AND (s.{q}worker_losses{q} IS NULL OR s.{q}losses{q} <= s.{q}worker_losses{q}))
        OR (s.{q}status{q} = 'running' AND s.{q}lease_expires_at{q} <= {now_ms} AND (
            s.{q}provisional{q} = TRUE
            OR (s.{q}worker_losses{q} IS NULL AND s.{q}attempt{q} < s.{q}budget_base{q} + s.{q}retries{q} + 1)
            OR s.{q}losses{q} < s.{q}worker_losses{q}))
    )
    AND (%(by_take)s = FALSE OR s.{q}status{q} <> 'running' OR s.{q}provisional{q} = FALSE)
"""

#: The attempt number is advanced by the same guarded UPDATE that grants the
#: lease, so the worker it is taken from is fenced out at once: every write of
#: an attempt is guarded by ``attempt = its number AND status = 'running'``.
#: A lost attempt whose worker surely started it counts a lost worker
#: (``losses``); one claimed ``provisional`` (by a take that took runs ahead:
#: the worker may have held it waiting, or its success unwritten, without
#: running it) is given back: ``budget_base`` rises with the attempt and no
#: loss is counted; the pass that runs it next claims it itself, so one
#: task that kills its worker spends its budget from its next loss on.
#: ``attempt``, ``losses``, ``budget_base`` and ``provisional`` are assigned
#: first: MySQL evaluates SET left to right, and they must read the old
#: status and ``provisional``.
_STEP_CLAIM_SET = """
    {q}attempt{q} = CASE WHEN s.{q}status{q} IN ('pending', 'scheduled')
        THEN s.{q}attempt{q} ELSE s.{q}attempt{q} + 1 END,
    {q}losses{q} = CASE WHEN s.{q}status{q} = 'running' AND s.{q}provisional{q} = FALSE
        THEN s.{q}losses{q} + 1 ELSE s.{q}losses{q} END,
    {q}budget_base{q} = CASE WHEN s.{q}status{q} = 'running' AND s.{q}provisional{q} = TRUE
        THEN s.{q}budget_base{q} + 1 ELSE s.{q}budget_base{q} END,
    {q}provisional{q} = %(provisional)s,
    {q}status{q} = 'running',
    {q}lease_expires_at{q} = {now_ms} + %(lease_ms)s,
    {q}result{q} = NULL,
    {q}error{q} = NULL,
    {q}updated_at{q} = {now_dt}
"""

#: One round trip: the guarded UPDATE and the attempt's history row in one
#: statement (a data-modifying CTE is atomic with the statement around it).
#: The step's columns are named (the model's), never ``*``: a statement
#: prepared on a long-lived connection keeps its result type when a migration
#: adds a column.
POSTGRESQL_STEP_CLAIM = (
    """
WITH clock AS (SELECT {now} AS now_ms),
claimed AS (
    UPDATE {step} AS s SET"""
    + _STEP_CLAIM_SET.replace("{now_ms}", "clock.now_ms").replace("{q}", '"')
    + """    FROM clock WHERE"""
    + _STEP_CLAIM_GUARD.replace("{now_ms}", "clock.now_ms").replace("{q}", '"')
    + """    RETURNING {step_columns_s}
),
history AS (
    INSERT INTO {attempt} ("step_id", "attempt", "status", "holder", "created_at", "running_at")
    SELECT "id", "attempt", 'running', %(holder)s::varchar, "updated_at", "updated_at" FROM claimed
    ON CONFLICT ("step_id", "attempt")
    DO UPDATE SET "status" = 'running', "holder" = EXCLUDED."holder", "running_at" = EXCLUDED."running_at"
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
#: running for one counted before (pending, scheduled). Every variant writes
#: the claiming worker's name (``%(holder)s``) into the row it writes, and
#: the claim's own now as its ``running_at``: the step's ``updated_at``, to
#: the microsecond (a task's start is reported from the claimed step alone).
SQLITE_STEP_CLAIM_HISTORY = """
INSERT INTO {attempt} ("step_id", "attempt", "status", "holder", "created_at", "running_at")
VALUES (%(step_id)s, %(attempt)s, 'running', %(holder)s, {now_dt}, {now_dt})
ON CONFLICT ("step_id", "attempt")
DO UPDATE SET "status" = 'running', "holder" = excluded."holder", "running_at" = excluded."running_at"
"""

MYSQL_STEP_CLAIM_HISTORY = """
INSERT INTO {attempt} (`step_id`, `attempt`, `status`, `holder`, `created_at`, `running_at`)
VALUES (%(step_id)s, %(attempt)s, 'running', %(holder)s, {now_dt}, {now_dt})
ON DUPLICATE KEY UPDATE `status` = 'running', `holder` = %(holder)s, `running_at` = {now_dt}
"""

#: A pass's reads of a run's steps, and of a step's attempts in order with
#: what a task's result needs of the step (columns ``step__*``): built once,
#: where the ORM's would be built anew for every run. Typed for PostgreSQL's
#: prepared statements.
_STEPS_OF_RUN = "SELECT * FROM {step} WHERE {q}run_id{q} = %(run_id)s{uuid}"
_ATTEMPTS_OF_STEP = """
SELECT a.*, s.{q}id{q} AS {q}step__id{q}, s.{q}status{q} AS {q}step__status{q},
    s.{q}attempt{q} AS {q}step__attempt{q}, s.{q}lease_expires_at{q} AS {q}step__lease_expires_at{q}
FROM {attempt} a JOIN {step} s ON s.{q}id{q} = a.{q}step_id{q}
WHERE s.{q}run_id{q} = %(run_id)s{uuid} AND s.{q}step_name{q} = %(step_name)s{text}
ORDER BY a.{q}attempt{q}
"""


def _reads(template: str) -> dict[str, str | tuple[str, ...]]:
    return {
        "postgresql": template.replace("{q}", '"').replace("{uuid}", "::uuid").replace("{text}", "::varchar"),
        "sqlite": template.replace("{q}", '"').replace("{uuid}", "").replace("{text}", ""),
        "mysql": template.replace("{q}", "`").replace("{uuid}", "").replace("{text}", ""),
    }


#: The step statements by name and variant (see ``sql.STATEMENTS``).
STEP_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "steps_of_run": _reads(_STEPS_OF_RUN),
    "attempts_of_step": _reads(_ATTEMPTS_OF_STEP),
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
