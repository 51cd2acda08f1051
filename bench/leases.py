"""
Lease operations against the floors they stand on, on the configured database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/leases.py [--seconds 2]

One process, one Django connection in autocommit: every lease operation and
every baseline goes through Django's cursor, so both carry the same overhead.
Each operation runs for ``--seconds`` of wall time in each of ``--rounds``
rounds (the order rotates per round) after a warm-up; the table shows the
median round. Statements are counted with ``connection.execute_wrapper``.
Targets from issue #2 are printed next to the numbers, never asserted.
See bench/README.md for what each number means and a recorded run.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _setup import ROOT, migrate_if_needed, revision  # noqa: F401  (first: sets Django up)
from django.db import connection, transaction

from pikku_django import sql
from pikku_django.models import Lease

PREFIX = "bench:"
HOLDER = "bench-holder"
OTHER = "bench-other"
TTL_MS = 60_000
HELD_TTL_MS = 3_600_000
#: Calls per slice whose log bytes are read (two extra statements each, outside the timing).
LOG_SAMPLES = 40
SELECT_ROW = "SELECT lease row by key"
UPDATE = "UPDATE 1 row by pk (durable)"


class StatementCounter:
    """An ``execute_wrapper`` that counts statements while ``on`` is set."""

    def __init__(self) -> None:
        self.on = False
        self.count = 0

    def __call__(
        self, execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        if self.on:
            self.count += 1
        return execute(sql_text, params, many, context)


@dataclass
class Op:
    """One measured operation: ``run`` is timed; ``setup`` runs before it, untimed and uncounted."""

    name: str
    run: Callable[[], Any]
    expect: Callable[[Any], bool] = lambda result: True
    setup: Callable[[], None] | None = None
    teardown: Callable[[], None] | None = None
    #: "update", "update2" or "select": the baseline its ratio divides by; None for a baseline.
    baseline: str | None = None
    #: One entry per round: (seconds/op, statements/op, log bytes/op, ratio to the baseline).
    rounds: list[tuple[float, float, float | None, float | None]] = field(default_factory=list)

    def median(self, index: int) -> float | None:
        values = [r[index] for r in self.rounds if r[index] is not None]
        return statistics.median(values) if values else None


class Bench:
    def __init__(self, seconds: float, rounds: int, warmup: float) -> None:
        self.seconds = seconds
        self.rounds = rounds
        self.warmup = warmup
        self.counter = StatementCounter()
        self.run_id = uuid.uuid4().hex[:8]
        self.which = sql.variant(connection)
        self.qn = connection.ops.quote_name
        self.table = self.qn(Lease._meta.db_table)
        self.serial = itertools.count(1)
        self.floors: dict[str, tuple[Op, int]] = {}

    # -- helpers ------------------------------------------------------------

    def key(self, name: str) -> str:
        return f"{PREFIX}{self.run_id}:{name}"

    def scalar(self, text: str, params: Any = None) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(text, params)
            row = cursor.fetchone()
        return None if row is None else row[0]

    def log_position(self) -> int | None:
        """Bytes of write-ahead/redo log written so far, server-wide (None on SQLite)."""
        if self.which == "postgresql":
            return int(self.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"))
        if self.which in ("mariadb", "mysql"):
            with connection.cursor() as cursor:
                cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'")
                row = cursor.fetchone()
            return None if row is None else int(row[1])
        return None

    def tidy(self) -> None:
        """Between slices: vacuum on PostgreSQL so no op inherits another's dead row versions."""
        if self.which == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"VACUUM {self.table}")

    # -- the operations -----------------------------------------------------

    def build(self) -> list[Op]:
        cols = ", ".join(self.qn(c) for c in ("key", "holder", "token", "expires_at"))
        select_row = f"SELECT {cols} FROM {self.table} WHERE {self.qn('key')} = %s"
        update_row = f"UPDATE {self.table} SET {self.qn('expires_at')} = %s WHERE {self.qn('key')} = %s"

        held_key = self.key("held")
        update_key = self.key("update")
        Lease.objects.create(key=update_key, holder="bench-baseline", token=1, expires_at=0)
        assert Lease.objects.acquire(held_key, HOLDER, HELD_TTL_MS) is not None
        own_key = self.key("own")
        assert Lease.objects.acquire(own_key, HOLDER, TTL_MS) is not None
        refreshed = Lease.objects.acquire(self.key("refresh"), HOLDER, TTL_MS)
        assert refreshed is not None
        release_key = self.key("release")
        cycle_key = self.key("cycle")
        free = itertools.count(1)
        to_release: list[Lease] = []
        lock_name = self.key("advisory")

        def select_one() -> Any:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                return cursor.fetchone()

        def select_lease_row() -> Any:
            with connection.cursor() as cursor:
                cursor.execute(select_row, [held_key])
                return cursor.fetchone()

        def update_one_row() -> Any:
            with connection.cursor() as cursor:
                cursor.execute(update_row, [next(self.serial), update_key])
                return cursor.rowcount

        def advisory_pair() -> Any:
            with connection.cursor() as cursor:
                if self.which == "postgresql":
                    cursor.execute("SELECT pg_try_advisory_lock(%s)", [4242])
                    (got,) = cursor.fetchone()
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [4242])
                else:
                    cursor.execute("SELECT GET_LOCK(%s, 0)", [lock_name])
                    (got,) = cursor.fetchone()
                    cursor.execute("SELECT RELEASE_LOCK(%s)", [lock_name])
                cursor.fetchone()
            return got

        def acquire_free() -> Any:
            return Lease.objects.acquire(self.key(f"free:{next(free)}"), HOLDER, TTL_MS)

        def drop_free() -> None:
            Lease.objects.filter(key__startswith=self.key("free:")).delete()

        def take_for_release() -> None:
            lease = Lease.objects.acquire(release_key, HOLDER, TTL_MS)
            assert lease is not None
            to_release.append(lease)

        def cycle() -> Any:
            lease = Lease.objects.acquire(cycle_key, HOLDER, TTL_MS)
            Lease.objects.release(lease)  # type: ignore[arg-type]
            return lease

        def portable(key: Callable[[], str], holder: str) -> Callable[[], Any]:
            def run() -> Any:
                return Lease.objects._acquire(
                    {"key": key(), "holder": holder, "ttl_ms": TTL_MS}, portable=True
                )

            return run

        def is_lease(result: Any) -> bool:
            return result is not None

        ops = [
            Op("SELECT 1", select_one),
            Op(SELECT_ROW, select_lease_row, lambda r: r is not None),
            Op(UPDATE, update_one_row, lambda r: r == 1),
        ]
        if self.which != "sqlite":
            ops.append(Op("advisory lock+unlock pair", advisory_pair, lambda r: r == 1))
        ops += [
            Op("acquire, free key", acquire_free, is_lease, teardown=drop_free, baseline="update"),
            Op(
                "acquire, own live key",
                lambda: Lease.objects.acquire(own_key, HOLDER, TTL_MS),
                is_lease,
                baseline="update",
            ),
            Op(
                "acquire, key held by other",
                lambda: Lease.objects.acquire(held_key, OTHER, TTL_MS),
                lambda r: r is None,
                baseline="select",
            ),
            Op("refresh", lambda: Lease.objects.refresh(refreshed, TTL_MS), is_lease, baseline="update"),
            Op(
                "release",
                lambda: Lease.objects.release(to_release.pop()),
                setup=take_for_release,
                baseline="update",
            ),
            Op("acquire+release cycle", cycle, is_lease, baseline="update2"),
        ]
        if self.which == "mariadb":
            ops += [
                Op(
                    "portable acquire, free key",
                    portable(lambda: self.key(f"free:{next(free)}"), HOLDER),
                    is_lease,
                    teardown=drop_free,
                    baseline="update",
                ),
                Op(
                    "portable acquire, own key",
                    portable(lambda: own_key, HOLDER),
                    is_lease,
                    baseline="update",
                ),
                Op(
                    "portable acquire, held key",
                    portable(lambda: held_key, OTHER),
                    lambda r: r is None,
                    baseline="select",
                ),
            ]
        return ops

    # -- measuring ----------------------------------------------------------

    def slice(self, op: Op, seconds: float) -> tuple[float, float, float | None, float | None]:
        """
        Run ``op`` for ``seconds`` of wall time. A lease op alternates, call by
        call, with its baseline (before it, then after it), so that both see
        the same disk and the same load: the ratio is taken inside the slice.
        Returns seconds per op, statements per op, log bytes per op (median of
        the first LOG_SAMPLES calls), and the ratio to the baseline.
        """
        self.tidy()
        counter = self.counter
        counter.count = 0
        floor, times = self.floors[op.baseline] if op.baseline else (None, 0)
        spent = floor_spent = 0.0
        done = 0
        logs: list[int] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if op.setup:
                op.setup()
            floor_first = floor is not None and done % 2 == 1
            if floor_first:
                floor_spent += self.call(floor, times)
            sample = done < LOG_SAMPLES and self.which != "sqlite"
            before = self.log_position() if sample else None
            counter.on = True
            started = time.perf_counter()
            result = op.run()
            spent += time.perf_counter() - started
            counter.on = False
            if before is not None:
                after = self.log_position()
                assert after is not None
                logs.append(after - before)
            if floor is not None and not floor_first:
                floor_spent += self.call(floor, times)
            done += 1
            if not op.expect(result):
                raise RuntimeError(f"{op.name}: unexpected result {result!r}")
        statements = counter.count
        if op.teardown:
            op.teardown()
        ratio = spent / floor_spent if floor is not None else None
        # The log counters are server-wide: another session's writes land in some
        # samples; the median ignores a few (run on a quiet server).
        return spent / done, statements / done, statistics.median(logs) if logs else None, ratio

    @staticmethod
    def call(floor: Op, times: int) -> float:
        """Time ``times`` calls of a baseline (uncounted: the counter is off)."""
        started = time.perf_counter()
        for _ in range(times):
            floor.run()
        return time.perf_counter() - started

    def run(self, ops: list[Op]) -> None:
        by_name = {op.name: op for op in ops}
        self.floors = {
            "update": (by_name[UPDATE], 1),
            "update2": (by_name[UPDATE], 2),
            "select": (by_name[SELECT_ROW], 1),
        }
        with connection.execute_wrapper(self.counter):
            for op in ops:
                self.slice(op, self.warmup)
            for n in range(self.rounds):
                shift = n % len(ops)
                for op in ops[shift:] + ops[:shift]:
                    op.rounds.append(self.slice(op, self.seconds))

    # -- the held-key probe -------------------------------------------------

    def held_key_probe(self) -> str:
        """
        Run the held-key acquire statement inside a transaction and ask the
        server what it wrote. (The manager refuses to run in a transaction, so
        this runs the statement text itself, then rolls back.)
        """
        params = {"key": self.key("held"), "holder": OTHER, "ttl_ms": TTL_MS}
        statements = sql.statement("lease_acquire", connection)
        texts = statements if isinstance(statements, tuple) else (statements,)
        with transaction.atomic():
            with connection.cursor() as cursor:
                for text in texts:
                    cursor.execute(text, params)
                if self.which == "postgresql":
                    cursor.execute("SELECT pg_current_xact_id_if_assigned()")
                    (xid,) = cursor.fetchone()
                    answer = (
                        "no transaction id assigned: writes nothing, no commit flush"
                        if xid is None
                        else f"transaction id {xid} assigned: it WRITES"
                    )
                elif self.which in ("mariadb", "mysql"):
                    cursor.execute(
                        "SELECT trx_rows_modified, trx_rows_locked, trx_lock_structs FROM "
                        "information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()"
                    )
                    row = cursor.fetchone()
                    answer = (
                        "no InnoDB transaction: writes nothing"
                        if row is None
                        else f"InnoDB rows modified {row[0]}, rows locked {row[1]}, lock structs {row[2]}"
                    )
                else:
                    answer = "SQLite: not probed"
            transaction.set_rollback(True)
        return answer

    # -- reporting ----------------------------------------------------------

    def describe(self) -> list[str]:
        import django as dj

        lines = [
            f"date:     {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"machine:  {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
            f"python:   {platform.python_version()}   django: {dj.get_version()}   code: {revision()}",
        ]
        with connection.cursor() as cursor:
            if self.which == "postgresql":
                import psycopg

                cursor.execute("SHOW server_version")
                version = cursor.fetchone()[0]
                cursor.execute(
                    "SELECT current_setting('synchronous_commit'), current_setting('fsync'), "
                    "current_setting('wal_sync_method')"
                )
                sync, fsync, method = cursor.fetchone()
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid() AND state <> 'idle'"
                )
                others = cursor.fetchone()[0]
                lines.append(
                    f"database: PostgreSQL {version} (psycopg {psycopg.__version__}); "
                    f"synchronous_commit={sync} fsync={fsync} wal_sync_method={method}"
                )
            elif self.which in ("mariadb", "mysql"):
                import MySQLdb

                cursor.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog")
                version, flush, log_bin, sync_binlog = cursor.fetchone()
                cursor.execute(
                    "SELECT COUNT(*) FROM information_schema.processlist "
                    "WHERE id <> CONNECTION_ID() AND command <> 'Sleep'"
                )
                others = cursor.fetchone()[0]
                lines.append(
                    f"database: {version} (mysqlclient {MySQLdb.version_info[:3]}); "
                    f"innodb_flush_log_at_trx_commit={flush} log_bin={log_bin} sync_binlog={sync_binlog}"
                )
            else:
                import sqlite3

                cursor.execute("PRAGMA journal_mode")
                journal = cursor.fetchone()[0]
                cursor.execute("PRAGMA synchronous")
                synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0])
                others = None
                lines.append(
                    f"database: SQLite {sqlite3.sqlite_version} file; journal_mode={journal} "
                    f"synchronous={synchronous}"
                )
        if others is not None:
            lines.append(f"other non-idle sessions on the server at start: {others}")
        lines.append(
            f"timing:   {self.rounds} rounds x {self.seconds:g} s per op (warm-up {self.warmup:g} s), "
            f"median round shown; load average {os.getloadavg()[0]:.2f} at start"
        )
        return lines

    def results(self, ops: list[Op]) -> list[str]:
        names = {"update": "1x UPDATE", "update2": "2x UPDATE", "select": "1x SELECT row"}
        head = (
            f"{'op':<30} {'ops/s':>7} {'us/op':>7} {'stmts/op':>8} {'log B/op':>8} "
            f"{'ratio':>6} {'unpaired':>8}  baseline"
        )
        lines = [head, "-" * len(head)]
        for op in ops:
            per_op, stmts, log, ratio = (op.median(i) for i in range(4))
            assert per_op is not None and stmts is not None
            paired = unpaired = vs = ""
            if op.baseline:
                floor, times = self.floors[op.baseline]
                floor_per_op = floor.median(0)
                assert ratio is not None and floor_per_op is not None
                paired, vs = f"{ratio:.2f}", names[op.baseline]
                unpaired = f"{per_op / (floor_per_op * times):.2f}"
            log_text = "-" if log is None else f"{log:.0f}"
            lines.append(
                f"{op.name:<30} {1 / per_op:>7.0f} {per_op * 1e6:>7.0f} {stmts:>8.2f} {log_text:>8} "
                f"{paired:>6} {unpaired:>8}  {vs}"
            )
        return lines

    def targets(self, ops: list[Op], probe: str) -> list[str]:
        by_name = {op.name: op for op in ops}

        def stmts(name: str) -> float:
            value = by_name[name].median(1)
            assert value is not None
            return value

        def ratio(name: str) -> float:
            value = by_name[name].median(3)
            assert value is not None
            return value

        checks: list[tuple[str, str, str, bool]] = []  # what, measured, target, met
        if self.which == "postgresql":
            for name in (
                "acquire, free key",
                "acquire, own live key",
                "acquire, key held by other",
                "refresh",
                "release",
            ):
                checks.append((f"{name}: statements/op", f"{stmts(name):.2f}", "1", stmts(name) <= 1))
            name = "acquire+release cycle"
            checks.append((f"{name}: statements/op", f"{stmts(name):.2f}", "2 (1 per op)", stmts(name) <= 2))
            checks.append((f"{name} / 2x durable UPDATE", f"{ratio(name):.2f}", "<= 1.2", ratio(name) <= 1.2))
            name = "acquire, key held by other"
            checks.append(
                ("held-key acquire / SELECT row", f"{ratio(name):.2f}", "<= 1.3", ratio(name) <= 1.3)
            )
            wrote = not probe.startswith("no ")
            checks.append(
                ("held-key acquire: xid assigned", "yes" if wrote else "no", "no (no write)", not wrote)
            )
        elif self.which == "mariadb":
            for name in (n for n in by_name if "acquire," in n):
                checks.append((f"{name}: statements/op", f"{stmts(name):.2f}", "<= 2", stmts(name) <= 2))
            for name in ("refresh", "release"):
                checks.append((f"{name}: statements/op", f"{stmts(name):.2f}", "1", stmts(name) <= 1))
        if not checks:
            return ["targets:  issue #2 sets none for this database"]
        lines = ["targets (issue #2; printed, not asserted; ratios are the paired ones):"]
        width = max(len(c[0]) for c in checks)
        for what, measured, target, met in checks:
            lines.append(
                f"  {what:<{width}}  {measured:>6}  target {target:<13} {'met' if met else 'MISSED'}"
            )
        if self.which in ("postgresql", "mariadb"):
            lines.append(f"  held-key acquire run in a transaction, then rolled back: {probe}")
        return lines


def positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=positive, default=2.0, help="wall time per op in each round (default %(default)r)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds; the median is shown (default %(default)r)"
    )
    parser.add_argument(
        "--warmup", type=positive, default=0.5, help="warm-up wall time per op (default %(default)r)"
    )
    args = parser.parse_args(argv)

    migrated = migrate_if_needed()
    Lease.objects.filter(key__startswith=PREFIX).delete()
    bench = Bench(args.seconds, max(1, args.rounds), args.warmup)
    try:
        ops = bench.build()
        header = bench.describe()
        if migrated:
            header.append("(migrated the database first)")
        probe = bench.held_key_probe()
        bench.run(ops)
        print("\n".join(header))
        print()
        print("\n".join(bench.results(ops)))
        print(f"(load average {os.getloadavg()[0]:.2f} at the end)")
        print()
        print("\n".join(bench.targets(ops, probe)))
        advisory = next((op for op in ops if op.name.startswith("advisory")), None)
        if advisory:
            cycle = next(op for op in ops if op.name == "acquire+release cycle")
            a, c = advisory.median(0), cycle.median(0)
            assert a is not None and c is not None
            print(
                f"\nacquire+release cycle / advisory lock+unlock pair: {c / a:.1f}x "
                f"(an advisory lock is not durable and dies with its session)"
            )
    finally:
        Lease.objects.filter(key__startswith=PREFIX).delete()


if __name__ == "__main__":
    main()
