"""Benchmark: drain+stage throughput of capture against the server's own pgoutput decode rate.

    python benchmarks/capture_throughput.py [--changes 1000000] [--transactions 100] [--rounds 3]

One throwaway PostgreSQL, one 7-column table, several slots created at the same point so each
measurement reads the same slot contents. The baseline is the server decoding the range by
itself: `count(*)` over a bounded `pg_logical_slot_peek_binary_changes`. Each reader then
drains and stages the same changes; the ratios are what to compare across machines. Each round
measures the baseline again and runs every reader once, in the other order from the round
before, on slots of its own: on a shared machine the server's decode alone moves by half from
one minute to the next, so each ratio is taken against its own round, and the median is the
figure.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from cdc_core.capture import capture
from cdc_core.config import load_pipeline
from cdc_core.lake import Lake
from cdc_core.pg.local import throwaway_cluster

TABLE = """CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, status text,
           total numeric(12,2), currency char(3), placed_at timestamptz, note text)"""


def server_decode_rate(dsn: str, slot: str, upto: str) -> tuple[int, float]:
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        row = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
            "'proto_version', '1', 'publication_names', 'bench', 'messages', 'true')",
            (slot, upto),
        ).fetchone()
        seconds = time.perf_counter() - started
    assert row is not None
    return int(row[0]), seconds


def pipeline_home(dsn: str, slot: str, reader: str, root: Path) -> Path:
    home = root / f"home-{reader}"
    (home / "pipelines").mkdir(parents=True)
    (home / "conf").mkdir()
    (home / "conf" / "local.yaml").write_text("spark: {}\n")
    (home / "pipelines" / "bench.yaml").write_text(
        f"name: bench\nsource:\n  dsn: {dsn}\n  slot: {slot}\n  publication: bench\n"
        f"  tables: [public.orders]\n  reader: {reader}\ntarget:\n  root: {home / 'lake'}\n"
    )
    return home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--transactions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    readers = ["stream", "sql"]
    rounds = range(args.rounds)
    try:
        with throwaway_cluster("bench") as cluster:
            dsn = cluster.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE)
                conn.execute("CREATE PUBLICATION bench FOR TABLE orders")
                for r in rounds:
                    for slot in [f"bench_baseline_{r}"] + [f"bench_{x}_{r}" for x in readers]:
                        conn.execute(
                            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
                        )
                per_txn = args.changes // args.transactions
                for t in range(args.transactions):
                    conn.execute(
                        "INSERT INTO orders SELECT g, g %% 1000, 'shipped', (g %% 100000) / 100.0, "
                        "'EUR', now(), 'note ' || g FROM generate_series(%s::bigint, %s::bigint) g",
                        (t * per_txn + 1, (t + 1) * per_txn),
                    )
                upto = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]  # type: ignore[index]
            ratios: dict[str, list[float]] = {x: [] for x in readers}
            for r in rounds:
                baseline_n, baseline_s = server_decode_rate(dsn, f"bench_baseline_{r}", upto)
                baseline = baseline_n / baseline_s
                print(f"round {r + 1}: server decode (count(*) over a bounded peek): "
                      f"{baseline_n:,} messages in {baseline_s:.2f} s = {baseline:,.0f}/s")  # fmt: skip
                for reader in readers if r % 2 == 0 else readers[::-1]:
                    home = pipeline_home(dsn, f"bench_{reader}_{r}", reader, root / str(r))
                    config = load_pipeline("bench", home=home)
                    started = time.perf_counter()
                    summary = capture(config, Lake(config.pipeline.target.root))
                    seconds = time.perf_counter() - started
                    if summary.changes != per_txn * args.transactions:  # a fast wrong reader
                        raise SystemExit(f"the {reader} reader staged {summary.changes:,} "
                                         f"changes of {per_txn * args.transactions:,}")  # fmt: skip
                    messages = summary.changes + 2 * summary.transactions  # plus Begin and Commit
                    rate = messages / seconds
                    ratios[reader].append(rate / baseline)
                    print(
                        f"  {reader:>6} reader drain+stage: {summary.changes:,} changes in "
                        f"{seconds:.2f} s = {rate:,.0f} messages/s, ratio {rate / baseline:.2f}"
                    )
            for reader, got in ratios.items():
                print(f"{reader:>6} reader: ratio to the server's decode, median "
                      f"{statistics.median(got):.2f} over {len(got)} rounds "
                      f"({min(got):.2f}-{max(got):.2f})")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
