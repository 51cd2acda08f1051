"""
PostgreSQL: three ways to stop planning the hot statements afresh on every
call, on Django's default settings, measured side by side (issue #9).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv/bin/python bench/prepare_choices.py

On the held key (a refused acquire: no write, so no disk in the figure) and on
the acquire+release cycle of a lapsed key, each variant alternates call by
call with the others and with the read-only SELECT of the row (the baseline
of the refused acquire) or two one-row durable UPDATEs (the cycle's):

* ``client-bound`` -- the acquire statement through Django's own cursor
  (client-side binding: parsed, analysed and planned on every call);
* ``prepared cursor`` -- what ``Lease.objects.acquire`` does now: the same
  text on a psycopg cursor that prepares it on the connection;
* ``PL/pgSQL function`` -- the same statement as the body of a function
  (created in ``pg_temp`` for the run), whose plan PL/pgSQL caches per session,
  called through Django's cursor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from _setup import migrate_if_needed  # noqa: F401  (first: sets Django up)
from django.db import connection

from bench.steps import environment, positive_int
from pikku_django import sql
from pikku_django.models import Lease
from pikku_django.sql.cursors import hot_cursor

KEY, HOLDER, OTHER, TTL = "bench:choices", "holder", "other", 600_000


def function_sql() -> str:
    body = sql.statement("lease_acquire", connection)
    for name, arg in (("key", "p_key"), ("holder", "p_holder"), ("ttl_ms", "p_ttl")):
        body = body.replace(f"%({name})s", arg)
    return (
        "CREATE OR REPLACE FUNCTION pg_temp.pikku_acquire(p_key varchar, p_holder varchar, p_ttl bigint) "
        "RETURNS TABLE (key varchar, holder varchar, token bigint, expires_at bigint) "
        "LANGUAGE plpgsql AS $body$\n#variable_conflict use_column\nBEGIN\nRETURN QUERY "
        + body
        + ";\nEND\n$body$"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=positive_int, default=2000, help="calls per variant per round")
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("PostgreSQL only.")
    migrate_if_needed()
    acquire = sql.statement("lease_acquire", connection)
    release = sql.statement("lease_release", connection)
    table = connection.ops.quote_name(Lease._meta.db_table)
    select = f'SELECT "key", "holder", "token", "expires_at" FROM {table} WHERE "key" = %s'
    update = f'UPDATE {table} SET "expires_at" = %s WHERE "key" = %s'
    with connection.cursor() as cursor:
        cursor.execute(function_sql())
    Lease.objects.filter(key__startswith="bench:choices").delete()
    Lease.objects.create(key=KEY, holder=OTHER, token=1, expires_at=2**62)
    Lease.objects.create(key=KEY + ":floor", holder=OTHER, token=1, expires_at=0)
    counter = [0]

    def client(params: dict[str, object]) -> object:
        with connection.cursor() as cursor:
            cursor.execute(acquire, params)
            return cursor.fetchone()

    def prepared(params: dict[str, object]) -> object:
        with hot_cursor(connection) as cursor:
            cursor.execute(acquire, params)
            return cursor.fetchone()

    def function(params: dict[str, object]) -> object:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM pg_temp.pikku_acquire(%(key)s, %(holder)s, %(ttl_ms)s)", params)
            return cursor.fetchone()

    def baseline_select() -> None:
        with connection.cursor() as cursor:
            cursor.execute(select, [KEY])
            cursor.fetchone()

    def baseline_updates() -> None:
        with connection.cursor() as cursor:
            for _ in range(2):
                counter[0] += 1
                cursor.execute(update, [counter[0], KEY + ":floor"])

    variants: dict[str, Callable[[dict[str, object]], object]] = {
        "client-bound": client,
        "prepared cursor": prepared,
        "PL/pgSQL function": function,
    }

    def held(fn: Callable[[dict[str, object]], object]) -> Callable[[], None]:
        def call() -> None:
            assert fn({"key": KEY, "holder": HOLDER, "ttl_ms": TTL}) is None

        return call

    def cycle(fn: Callable[[dict[str, object]], object], key: str) -> Callable[[], None]:
        def call() -> None:
            row = fn({"key": key, "holder": HOLDER, "ttl_ms": TTL})
            with hot_cursor(connection) as cursor:
                cursor.execute(release, {"key": key, "holder": HOLDER, "token": row[2]})  # type: ignore[index]

        return call

    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for kind, base in (
            ("refused acquire / SELECT row", baseline_select),
            ("cycle / 2 UPDATEs", baseline_updates),
        ):
            calls = {
                name: (held(fn) if kind.startswith("refused") else cycle(fn, f"{KEY}:{name}"))
                for name, fn in variants.items()
            }
            spent = dict.fromkeys([*calls, "base"], 0.0)
            for n in range(args.calls):
                order = [*calls.items(), ("base", base)]
                shift = n % len(order)
                for name, call in order[shift:] + order[:shift]:
                    started = time.perf_counter()
                    call()
                    spent[name] += time.perf_counter() - started
            for name in calls:
                results.setdefault(f"{kind}: {name}", []).append(spent[name] / spent["base"])
                results.setdefault(f"{kind}: {name} us", []).append(spent[name] / args.calls * 1e6)
            results.setdefault(f"{kind}: baseline us", []).append(spent["base"] / args.calls * 1e6)
    Lease.objects.filter(key__startswith="bench:choices").delete()
    print("\n".join(environment()))
    print(f"{args.calls} calls per variant per round, interleaved; {args.rounds} rounds, median shown\n")
    head = f"{'variant':<55} {'us/call':>8} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for kind in ("refused acquire / SELECT row", "cycle / 2 UPDATEs"):
        print(f"{kind + ': baseline':<55} {statistics.median(results[f'{kind}: baseline us']):>8.0f}")
        for name in variants:
            us = statistics.median(results[f"{kind}: {name} us"])
            print(
                f"{kind + ': ' + name:<55} {us:>8.0f} {statistics.median(results[f'{kind}: {name}']):>6.2f}"
            )
    print(f"(load average {os.getloadavg()[0]:.2f} at the end)")


if __name__ == "__main__":
    main()
