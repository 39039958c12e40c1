"""Benchmark: what the SQL interface allows a slot reader, fetching a peek's rows and nothing else.

    python benchmarks/peek_fetch.py [--changes 1000000] [--rounds 3]

The slot contents are the capture benchmark's (a 7-column table, 1,000,000 inserts in 100
transactions). The baseline is the server decoding the range by itself, `count(*)` over a
bounded `pg_logical_slot_peek_binary_changes`; each way of fetching the same peek's rows is
timed against it in the same round (a peek does not consume, so every fetch reads the same
changes). The best of these is the ceiling for any reader that uses SQL peeks.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from itertools import islice

import psycopg

from cdc_core.pg.local import throwaway_cluster

TABLE = """CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, status text,
           total numeric(12,2), currency char(3), placed_at timestamptz, note text)"""

PEEK = (
    "pg_logical_slot_peek_binary_changes('bench', %s::pg_lsn, NULL, 'proto_version', '1', "
    "'publication_names', 'bench', 'messages', 'true')"
)
ROWS = f"SELECT (lsn - '0/0')::bigint, data FROM {PEEK}"


def timed(dsn: str, fetch: Callable[[psycopg.Connection[tuple[object, ...]]], int]) -> float:
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        assert fetch(conn) > 0
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with throwaway_cluster("peek") as cluster:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("CREATE PUBLICATION bench FOR TABLE orders")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            per_txn = args.changes // 100
            for t in range(100):
                conn.execute(
                    "INSERT INTO orders SELECT g, g %% 1000, 'shipped', (g %% 100000) / 100.0, "
                    "'EUR', now(), 'note ' || g FROM generate_series(%s::bigint, %s::bigint) g",
                    (t * per_txn + 1, (t + 1) * per_txn),
                )
            upto = str(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])  # type: ignore[index]

        def count(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            return int(conn.execute(f"SELECT count(*) FROM {PEEK}", (upto,)).fetchone()[0])  # type: ignore[index]

        def one_at_a_time(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            return sum(1 for _ in conn.cursor(binary=True).stream(ROWS, (upto,)))

        def server_cursor(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            n = 0
            with conn.transaction(), conn.cursor(name="peek", binary=True) as cur:
                cur.execute(ROWS, (upto,))
                while rows := cur.fetchmany(10_000):
                    n += len(rows)
            return n

        def all_at_once(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            cur = conn.cursor(binary=True)
            cur.execute(ROWS, (upto,))
            return len(cur.fetchall())

        def chunked(conn: psycopg.Connection[tuple[object, ...]]) -> int:  # the sql reader's way
            rows, n = conn.cursor(binary=True).stream(ROWS, (upto,), size=10_000), 0
            while batch := list(islice(rows, 10_000)):
                n += len(batch)
            return n

        def copy_binary(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            n = 0
            query = f"COPY ({ROWS.replace('%s', repr(upto))}) TO STDOUT (FORMAT binary)"
            with conn.cursor().copy(query) as copy:
                while copy.read():
                    n += 1
            return n

        ways = {
            "one row at a time (stream)": one_at_a_time,
            "server-side cursor, FETCH 10,000": server_cursor,
            "all at once (fetchall)": all_at_once,
            "COPY ... TO STDOUT binary, bytes only": copy_binary,
            "chunks of 10,000 as they come": chunked,
        }
        for n in range(args.rounds):
            baseline = timed(dsn, count)
            print(f"round {n + 1}: server decode (count(*)) {baseline:.2f} s")
            for name, fetch in ways.items():
                seconds = timed(dsn, fetch)
                print(f"  {name:40} {seconds:.2f} s, ratio {baseline / seconds:.2f}")


if __name__ == "__main__":
    main()
