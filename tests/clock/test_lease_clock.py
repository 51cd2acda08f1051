"""
Leases are judged on the database's clock: a worker whose clock runs two hours
fast can neither take a live lease nor stretch its own; a MariaDB session whose
local time repeats an hour in a DST fall-back still counts real time; both of
MariaDB's acquire forms keep the contract; every lease operation costs the
statements it should; and on PostgreSQL a refused acquire writes nothing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import skipIf, skipUnless

from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TransactionTestCase

from pikku_django import sql
from pikku_django.models import Lease
from tests.support.children import finish, kill_all, poll_until, read_line, send_line, start_script
from tests.support.factories import lapse

TTL = 60_000
TWO_HOURS_MS = 2 * 3600 * 1000


def is_mariadb(conn: BaseDatabaseWrapper) -> bool:
    return conn.vendor == "mysql" and bool(conn.mysql_is_mariadb)  # type: ignore[attr-defined]


@contextmanager
def count_statements(conn: BaseDatabaseWrapper) -> Iterator[list[str]]:
    """Every statement ``conn`` sends while the block runs (opens it first)."""
    conn.ensure_connection()
    statements: list[str] = []

    def wrapper(execute, sql_text, params, many, context):  # type: ignore[no-untyped-def]
        statements.append(sql_text)
        return execute(sql_text, params, many, context)

    with conn.execute_wrapper(wrapper):
        yield statements


# ---------------------------------------------------------------------------
# A process whose clock runs two hours fast
# ---------------------------------------------------------------------------

#: Runs under ``faketime -f +2h``. Reports its own clock beside the DB's (so the
#: test cannot pass without the skew), tries the parent's live lease, takes and
#: refreshes a 2 s lease of its own, then waits until the parent says that lease
#: has lapsed on the DB clock and tries to refresh it again.
SKEWED = """
import json, sys, time
import django
django.setup()
from pikku_django.models import Lease

held_key, own_key, holder = sys.argv[1:4]
db = Lease.objects.db_now_ms
report = {"time_ms": int(time.time() * 1000), "db_now_ms": db()}
taken = Lease.objects.acquire(held_key, holder, 60000)
report["held_taken"] = None if taken is None else taken.token
before = db()
lease = Lease.objects.acquire(own_key, holder, 2000)
after = db()
report["acquired"] = {"token": lease.token, "expires_at": lease.expires_at, "before": before, "after": after}
before = db()
renewed = Lease.objects.refresh(lease, 2000)
after = db()
report["refreshed"] = {"token": renewed.token, "expires_at": renewed.expires_at,
                       "before": before, "after": after}
print(json.dumps(report), flush=True)
sys.stdin.readline()  # the parent has seen the lease lapse on the DB clock
late = Lease.objects.refresh(renewed, 60000)
print(json.dumps({"late_refresh": None if late is None else late.expires_at}), flush=True)
"""


@skipIf(
    connection.vendor == "sqlite",
    "on SQLite the lease clock is the process clock by design (one host), so a "
    "process with a skewed clock skews the lease clock too",
)
class ClockSkewTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def tearDown(self) -> None:
        kill_all(self.procs)

    def test_a_process_two_hours_fast_is_judged_by_the_db_clock(self) -> None:
        held = Lease.objects.acquire("skew:held", "parent", TTL)
        assert held is not None
        proc = start_script(SKEWED, "skew:held", "skew:own", "skewed", prefix=["faketime", "-f", "+2h"])
        self.procs.append(proc)
        report = json.loads(read_line(proc, timeout=60))
        parent_now = Lease.objects.db_now_ms()
        own = Lease.objects.current("skew:own")

        # The child's clock really runs two hours ahead of the database's.
        skew = report["time_ms"] - report["db_now_ms"]
        print(f"\nchild clock ahead of the DB clock by {skew / 3_600_000:.3f} h")  # noqa: T201
        assert abs(skew - TWO_HOURS_MS) < 60_000, skew

        # It cannot take the parent's live lease, and the row is untouched.
        assert report["held_taken"] is None
        row = Lease.objects.get(key="skew:held")
        assert (row.holder, row.token, row.expires_at) == ("parent", 1, held.expires_at)

        # Its own lease was written on the DB clock, not its own.
        acquired, refreshed = report["acquired"], report["refreshed"]
        assert acquired["token"] == 1
        assert acquired["before"] + 2000 <= acquired["expires_at"] <= acquired["after"] + 2000
        assert parent_now + 2000 - 1000 <= acquired["expires_at"] <= parent_now + 2000
        # The refresh does not stretch it beyond DB now + ttl either.
        assert refreshed["token"] == 1
        assert refreshed["before"] + 2000 <= refreshed["expires_at"] <= refreshed["after"] + 2000
        assert parent_now + 2000 - 1000 <= refreshed["expires_at"] <= parent_now + 2000
        # The parent, on the DB clock, sees it live.
        assert own is not None, "the skewed child's 2 s lease should still be live"
        assert (own.holder, own.token, own.expires_at) == ("skewed", 1, refreshed["expires_at"])

        # It lapses on time for everyone else: within the ttl on the DB clock ...
        lapsed_at = poll_until(
            lambda: Lease.objects.current("skew:own") is None and Lease.objects.db_now_ms(), timeout=5
        )
        assert lapsed_at >= refreshed["expires_at"]
        # ... and the skewed holder cannot renew it once it has lapsed.
        send_line(proc, "lapsed?")
        late = json.loads(read_line(proc, timeout=30))
        assert late["late_refresh"] is None
        assert Lease.objects.get(key="skew:own").expires_at == refreshed["expires_at"]
        finish(proc, timeout=30)

        taken = Lease.objects.acquire("skew:own", "parent", TTL)
        assert taken is not None and taken.token == 2
        assert taken.expires_at - TTL >= refreshed["expires_at"]


# ---------------------------------------------------------------------------
# DST fall-back on MariaDB
# ---------------------------------------------------------------------------

#: 2026-11-01 in America/New_York: 05:30 UTC is 01:30 EDT, 06:30 UTC is 01:30 EST.
AT_0530 = 1_793_511_000
AT_0530_30 = AT_0530 + 30
AT_0630 = AT_0530 + 3600


@skipUnless(
    connection.vendor == "mysql",
    "SET timestamp and session time zones are MySQL/MariaDB's; PostgreSQL reads "
    "clock_timestamp() and SQLite the process clock, neither settable per session",
)
class MariaDbDstTests(TransactionTestCase):
    def setUp(self) -> None:
        # A separate session under its own alias, so Lease.objects.db_manager("dst")
        # runs on it; the test's own connection keeps the real clock.
        dst = connection.copy(alias="dst")
        connections["dst"] = dst
        self.addCleanup(lambda: connections.__delitem__("dst"))
        self.addCleanup(dst.close)
        self.dst = dst
        self.leases = Lease.objects.db_manager("dst")
        with dst.cursor() as cursor:
            cursor.execute("SET time_zone = 'America/New_York'")

    def at(self, timestamp: float | str) -> dict[str, Any]:
        """Set the session's clock; return what local-time arithmetic makes of it."""
        with self.dst.cursor() as cursor:
            cursor.execute(f"SET timestamp = {timestamp}")
            cursor.execute(
                "SELECT CAST(NOW() AS CHAR), TIMESTAMPDIFF(SECOND, '1970-01-01', NOW()), "
                "UNIX_TIMESTAMP(NOW())"
            )
            local, naive_diff, unix_of_local = cursor.fetchone()
        return {"local": local, "naive_s": int(naive_diff), "unix_of_local": int(unix_of_local)}

    def test_db_now_ms_is_exact_under_set_timestamp(self) -> None:
        self.at("1793511000.250")
        assert self.leases.db_now_ms() == 1_793_511_000_250
        self.at(AT_0630)
        assert self.leases.db_now_ms() == AT_0630 * 1000
        # The test's own session still runs on the real clock.
        assert abs(Lease.objects.db_now_ms() - AT_0630 * 1000) > 60_000

    def test_lease_lapses_across_the_repeated_hour(self) -> None:
        first = self.at(AT_0530)
        lease = self.leases.acquire("dst", "a", TTL)
        assert lease is not None and lease.token == 1
        assert lease.expires_at == AT_0530 * 1000 + TTL

        # Thirty seconds later it is still live.
        self.at(AT_0530_30)
        assert self.leases.acquire("dst", "b", TTL) is None
        assert self.leases.current("dst") == lease

        # An hour later, at the same local 01:30, it has lapsed: another holder takes it.
        second = self.at(AT_0630)
        assert first["local"] == second["local"] == "2026-11-01 01:30:00"
        taken = self.leases.acquire("dst", "b", TTL)
        assert taken is not None and (taken.holder, taken.token) == ("b", 2)
        assert taken.expires_at == AT_0630 * 1000 + TTL
        assert taken.expires_at - lease.expires_at == 3600 * 1000

        # The hazard the clock avoids: counted from local NOW() (as naive code
        # would), the two instants an hour apart are the same second, so the
        # lease taken at 05:30 would still look live at 06:30 for a whole hour.
        assert second["naive_s"] - first["naive_s"] == 0
        assert second["unix_of_local"] - first["unix_of_local"] == 0
        naive_expiry_ms = first["naive_s"] * 1000 + TTL
        assert second["naive_s"] * 1000 < naive_expiry_ms


# ---------------------------------------------------------------------------
# MariaDB's two acquire forms
# ---------------------------------------------------------------------------


class AcquireFormContract:
    """The acquire contract, run through one of the manager's statement forms."""

    portable: bool

    def acquire(self, key: str, holder: str, ttl_ms: int = TTL) -> Lease | None:
        return Lease.objects._acquire(
            {"key": key, "holder": holder, "ttl_ms": ttl_ms}, portable=self.portable
        )

    def setUp(self) -> None:
        if not is_mariadb(connection):
            self.skipTest(  # type: ignore[attr-defined]
                "only MariaDB has the INSERT ... RETURNING form beside the portable MySQL 8 one"
            )

    def test_new_key_gets_token_one(self) -> None:
        before = Lease.objects.db_now_ms()
        lease = self.acquire("k", "a")
        after = Lease.objects.db_now_ms()
        assert lease is not None and (lease.key, lease.holder, lease.token) == ("k", "a", 1)
        assert before + TTL <= lease.expires_at <= after + TTL
        assert Lease.objects.get(key="k").expires_at == lease.expires_at

    def test_live_lease_refuses_another_holder_and_changes_nothing(self) -> None:
        held = self.acquire("k", "a")
        assert self.acquire("k", "b") is None
        row = Lease.objects.get(key="k")
        assert (row.holder, row.token, row.expires_at) == ("a", 1, held.expires_at)

    def test_own_reacquire_keeps_token_and_sets_expiry(self) -> None:
        first = self.acquire("k", "a")
        longer = self.acquire("k", "a", TTL * 2)
        assert longer is not None and longer.token == first.token == 1
        assert longer.expires_at > first.expires_at
        shorter = self.acquire("k", "a", 1_000)
        assert shorter is not None and shorter.token == 1 and shorter.expires_at < longer.expires_at
        assert Lease.objects.get(key="k").expires_at == shorter.expires_at

    def test_lapsed_lease_goes_to_the_next_holder_with_token_plus_one(self) -> None:
        old = self.acquire("k", "a")
        lapse("k")
        new = self.acquire("k", "b")
        assert new is not None and (new.holder, new.token) == ("b", 2)
        assert Lease.objects.refresh(old, TTL) is None
        lapse("k")
        again = self.acquire("k", "b")
        assert again is not None and again.token == 3

    def test_released_lease_goes_to_the_next_holder_with_token_plus_one(self) -> None:
        lease = self.acquire("k", "a")
        Lease.objects.release(lease)
        nxt = self.acquire("k", "b")
        assert nxt is not None and (nxt.holder, nxt.token) == ("b", 2)


@skipUnless(connection.vendor == "mysql", "the two acquire forms are MySQL/MariaDB's")
class MariaDbReturningAcquireTests(AcquireFormContract, TransactionTestCase):
    portable = False


@skipUnless(connection.vendor == "mysql", "the two acquire forms are MySQL/MariaDB's")
class MariaDbPortableAcquireTests(AcquireFormContract, TransactionTestCase):
    portable = True


# ---------------------------------------------------------------------------
# Statements per operation
# ---------------------------------------------------------------------------


class StatementsPerOperationTests(TransactionTestCase):
    def test_each_lease_operation_is_one_statement(self) -> None:
        counts: dict[str, int] = {}

        def count(name: str, call):  # type: ignore[no-untyped-def]
            with count_statements(connection) as statements:
                result = call()
            counts[name] = len(statements)
            return result

        lease = count("acquire free", lambda: Lease.objects.acquire("k", "a", TTL))
        assert lease is not None
        assert count("acquire own", lambda: Lease.objects.acquire("k", "a", TTL)) is not None
        assert count("acquire held", lambda: Lease.objects.acquire("k", "b", TTL)) is None
        lease = count("refresh", lambda: Lease.objects.refresh(lease, TTL))
        assert lease is not None
        count("release", lambda: Lease.objects.release(lease))
        assert count("acquire lapsed", lambda: Lease.objects.acquire("k", "b", TTL)) is not None
        count("current", lambda: Lease.objects.current("k"))
        count("db_now_ms", Lease.objects.db_now_ms)
        expected = dict.fromkeys(counts, 1)
        if connection.vendor == "mysql":
            portable = {"key": "p", "holder": "a", "ttl_ms": TTL}
            portable_acquire = lambda: Lease.objects._acquire(portable, portable=True)  # noqa: E731
            assert count("portable acquire", portable_acquire) is not None
            expected["portable acquire"] = 2
            if not is_mariadb(connection):  # MySQL 8 has only the portable form
                for name in ("acquire free", "acquire own", "acquire held", "acquire lapsed"):
                    expected[name] = 2
        print(f"\nstatements per operation on {connection.vendor}: {counts}")  # noqa: T201
        assert counts == expected


# ---------------------------------------------------------------------------
# PostgreSQL: a refused acquire writes nothing
# ---------------------------------------------------------------------------


@skipUnless(connection.vendor == "postgresql", "transaction ids, xmin and lock_timeout are PostgreSQL's")
class PostgresRefusedAcquireWritesNothingTests(TransactionTestCase):
    def setUp(self) -> None:
        self.other = connection.copy()
        self.addCleanup(self.other.close)

    def xid_after_acquire(self, key: str, holder: str) -> tuple[list[Any], str | None]:
        """Run the acquire statement in an open transaction; did it get a transaction id?"""
        other = self.other
        other.ensure_connection()
        other.set_autocommit(False)
        try:
            with other.cursor() as cursor:
                cursor.execute(
                    sql.statement("lease_acquire", other), {"key": key, "holder": holder, "ttl_ms": TTL}
                )
                rows = cursor.fetchall()
                cursor.execute("SELECT pg_current_xact_id_if_assigned()::text")
                (xid,) = cursor.fetchone()
        finally:
            other.rollback()
            other.set_autocommit(True)
        return rows, xid

    def xmin(self, key: str) -> str:
        with connection.cursor() as cursor:
            cursor.execute('SELECT xmin::text FROM pikku_lease WHERE "key" = %s', [key])
            return cursor.fetchone()[0]

    def test_acquire_of_a_held_key_assigns_no_transaction_id(self) -> None:
        Lease.objects.acquire("held", "a", TTL)
        rows, xid = self.xid_after_acquire("held", "b")
        assert rows == [] and xid is None
        # Controls: a free key, a lapsed key and the holder's own key are writes.
        rows, xid = self.xid_after_acquire("free", "b")
        assert len(rows) == 1 and xid is not None
        rows, xid = self.xid_after_acquire("held", "a")
        assert len(rows) == 1 and xid is not None
        lapse("held")
        rows, xid = self.xid_after_acquire("held", "b")
        assert len(rows) == 1 and xid is not None

    def test_acquire_of_a_held_key_leaves_the_row_version_alone(self) -> None:
        held = Lease.objects.acquire("held", "a", TTL)
        before = self.xmin("held")
        assert Lease.objects.acquire("held", "b", TTL) is None
        assert self.xmin("held") == before
        row = Lease.objects.get(key="held")
        assert (row.holder, row.token, row.expires_at) == ("a", 1, held.expires_at)
        # Control: the holder's own re-acquire is a new row version.
        assert Lease.objects.acquire("held", "a", TTL) is not None
        assert self.xmin("held") != before

    def test_acquire_of_a_held_key_does_not_wait_for_the_row_lock(self) -> None:
        Lease.objects.acquire("held", "a", TTL)
        other = self.other
        other.ensure_connection()
        other.set_autocommit(False)
        try:
            with other.cursor() as cursor:
                cursor.execute('SELECT 1 FROM pikku_lease WHERE "key" = %s FOR UPDATE', ["held"])
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
            try:
                # Would raise "canceling statement due to lock timeout" if it waited.
                assert Lease.objects.acquire("held", "b", TTL) is None
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        finally:
            other.rollback()
            other.set_autocommit(True)
