"""Benchmark: an initial snapshot into bronze and silver, against a plain JDBC -> Delta copy.

    python benchmarks/snapshot.py [--rows 5000000] [--chunk-size 100000] [--threads 4]

A throwaway PostgreSQL gets an orders-like table of `rows` rows (7 columns: bigint key,
bigint, text, numeric(12,2), char(3), timestamptz, text). In the same run, on the same data:

- `COPY ... TO STDOUT`, drained by psycopg: how fast the server hands the table out;
- a plain partitioned `spark.read.jdbc` (4 partitions on the key) written to one Delta table:
  the baseline;
- the product: `ingest` with `snapshot.mode: initial` (chunked reads under exported snapshots,
  Debezium envelopes into bronze, typed silver mirror), then a check that silver has every row.

Both Spark sides run on conf/local.yaml's settings, what a local run of the product gets, and
on a warm JVM: the plain copy runs once untimed first.
Prints each one's rows/s, the ratios and the driver's peak memory (VmHWM of this process,
which is the product's driver).
"""

from __future__ import annotations

import argparse
import logging
import resource
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg
import yaml

from cdc_core.config import SparkSettings, load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.local import throwaway_cluster
from cdc_core.pipeline import RunOptions, run
from cdc_core.snapshot_read import jdbc_target
from cdc_core.spark import build_spark

DDL = """
CREATE TABLE bench (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
    total numeric(12,2) NOT NULL, currency char(3) NOT NULL, placed_at timestamptz NOT NULL,
    note text
)
"""
LOAD = """
INSERT INTO bench
SELECT i, i %% 100000, (ARRAY['pending','paid','shipped','delivered'])[1 + i %% 4],
       (i %% 100000) / 100.0, 'EUR', timestamptz '2024-01-01' + i * interval '1 second',
       CASE WHEN i %% 10 = 0 THEN NULL ELSE 'note ' || i END
FROM generate_series(%s::bigint, %s::bigint) i
"""
ROOT = Path(__file__).resolve().parents[1]


def spark_conf() -> dict[str, str]:
    """conf/local.yaml's Spark settings (what a local run of the product gets), with 4 GiB for
    the driver. Both sides of the comparison run on them."""
    local = yaml.safe_load((ROOT / "conf" / "local.yaml").read_text())
    conf = {k: str(v) for k, v in local["spark"]["conf"].items() if "${" not in str(v)}
    return conf | {"spark.driver.memory": "4g"}


def peak_rss_mib(pid: int | str = "self") -> float:
    """Peak resident memory of a process (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
        step = 1_000_000
        for lo in range(1, rows + 1, step):
            conn.execute(LOAD, (lo, min(lo + step - 1, rows)))
        conn.execute("VACUUM ANALYZE bench")


def copy_out(dsn: str) -> tuple[float, int]:
    started = time.perf_counter()
    size = 0
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor() as cur,
        cur.copy("COPY bench TO STDOUT") as copy,
    ):
        for block in copy:
            size += len(block)
    return time.perf_counter() - started, size


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cdc-bench-snapshot-"))
    try:
        with throwaway_cluster("bench") as cluster:
            dsn = cluster.dsn("postgres")
            started = time.perf_counter()
            load(dsn, args.rows)
            print(f"source: {args.rows:,} rows loaded ({time.perf_counter() - started:.0f} s)")

            copy_s, size = copy_out(dsn)
            print(f"COPY TO STDOUT: {args.rows / copy_s:,.0f} rows/s ({copy_s:.1f} s, "
                  f"{size / 2**20:,.0f} MiB)")  # fmt: skip

            (home / "pipelines").mkdir()
            (home / "conf").mkdir()
            spark_settings = spark_conf()
            conf = "\n".join(f'    {k}: "{v}"' for k, v in spark_settings.items())
            (home / "conf" / "local.yaml").write_text(
                f"spark:\n  master: local[2]\n  conf:\n{conf}\n"
            )
            (home / "pipelines" / "bench.yaml").write_text(textwrap.dedent(f"""\
                name: bench
                source:
                  dsn: {dsn}
                  slot: bench_cdc
                  publication: bench_cdc
                  tables: [public.bench]
                snapshot:
                  mode: initial
                  chunk.size: {args.chunk_size}
                  max.threads: {args.threads}
                target:
                  root: {home / "lake"}
                """))  # fmt: skip
            config = load_pipeline("bench", "local", home=home)
            spark = build_spark(
                SparkSettings(master="local[2]", conf=spark_settings), "bench-snapshot"
            )

            url, props = jdbc_target(config.pipeline.source.dsn)

            def plain_copy(target: str) -> float:
                started = time.perf_counter()
                (
                    spark.read.jdbc(url, "bench", column="id", lowerBound=1, upperBound=args.rows,
                                    numPartitions=args.threads, properties=props | {"fetchsize": "10240"})
                    .write.format("delta").save(str(home / target))
                )  # fmt: skip
                return time.perf_counter() - started

            # Once untimed, so that the baseline, like the product after it, runs on a warm JVM
            # and a warm page cache: a first copy here takes about three times as long.
            warm_s = plain_copy("warm-up")
            print(f"warm-up (the same copy, untimed in the ratio): {warm_s:.1f} s")
            plain_s = plain_copy("plain")
            print(
                f"plain spark.read.jdbc -> Delta: {args.rows / plain_s:,.0f} rows/s ({plain_s:.1f} s)"
            )

            rss_before = peak_rss_mib()
            started = time.perf_counter()
            summary = run(config, RunOptions())
            product_s = time.perf_counter() - started
            silver_path = Lake(str(home / "lake")).silver(TableName("public", "bench"))
            silver = spark.read.format("delta").load(silver_path)
            assert silver.count() == args.rows, "silver does not hold every row"
            print(f"product snapshot -> bronze + silver: {args.rows / product_s:,.0f} rows/s "
                  f"({product_s:.1f} s; {summary.snapshot_rows:,} rows read)")  # fmt: skip
            print(f"ratio (product / plain JDBC -> Delta): {plain_s / product_s:.2f}")
            print(f"ratio (product / COPY TO STDOUT): {copy_s / product_s:.2f}")
            jvm = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
            print(f"driver peak RSS: Python {peak_rss_mib():,.0f} MiB (before the snapshot "
                  f"{rss_before:,.0f} MiB); JVM (driver and local executors) {peak_rss_mib(jvm):,.0f} MiB")  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
