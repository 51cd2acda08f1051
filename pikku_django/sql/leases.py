"""The lease statements: acquire, refresh, release, current, and the clock."""

from __future__ import annotations

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

#: Lapse the lease if it is still this holder's, of this token, and live; the
#: row count says whether it was (rows *matched* on MySQL, where Django sets
#: CLIENT.FOUND_ROWS), so a holder learns that its lease was lost even when
#: no renewal ever ran. The token stays, so the next holder gets a higher one;
#: the expiry never moves later. PostgreSQL reads its clock once, in
#: ``clock``, so the guard and the new expiry see the same instant.
POSTGRESQL_LEASE_RELEASE = """
UPDATE {lease} SET "expires_at" = LEAST("expires_at", clock.now_ms)
FROM (SELECT {now} AS now_ms) AS clock
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s
    AND "expires_at" > clock.now_ms
"""

SQLITE_LEASE_RELEASE = """
UPDATE {lease} SET "expires_at" = MIN("expires_at", {now})
WHERE "key" = %(key)s AND "holder" = %(holder)s AND "token" = %(token)s AND "expires_at" > {now}
"""

MYSQL_LEASE_RELEASE = """
UPDATE {lease} SET `expires_at` = LEAST(`expires_at`, {now})
WHERE `key` = %(key)s AND `holder` = %(holder)s AND `token` = %(token)s AND `expires_at` > {now}
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


#: The lease statements by name and variant (see ``sql.STATEMENTS``).
LEASE_STATEMENTS: dict[str, dict[str, str | tuple[str, ...]]] = {
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
