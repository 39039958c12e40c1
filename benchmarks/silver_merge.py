"""Benchmark: applying bronze changes to a large silver table, against a plain Delta MERGE.

    python benchmarks/silver_merge.py [--rows 5000000] [--changes 1000000]

A silver table of `rows` rows (an orders-like table, 7 columns) gets `changes` mixed changes
(70% updates of existing keys, 20% inserts, 10% deletes; at the default sizes each key changes
once, and the script prints how many changes and keys there are) through the product's silver
step: JSON parsing, typing on executors, TOAST and key-change handling, the newest change per
key and the guarded MERGE. The baseline, measured in the same run on an identical copy of the
table, is a plain Delta MERGE of the same final rows, already typed.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_core.config import SparkSettings
from cdc_core.envelope import BRONZE, SOURCE, conformed
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import ColumnType, SilverType
from cdc_core.silver import SilverSettings, merge_changes
from cdc_core.silver_shape import SilverColumn, TableShape
from cdc_core.silver_table import ensure_silver
from cdc_core.spark import build_spark

COLUMNS = [  # name, PostgreSQL type, silver type
    ("id", ColumnType("int8", "b", -1, False), SilverType("long")),
    ("customer_id", ColumnType("int8", "b", -1, False), SilverType("long")),
    ("status", ColumnType("text", "b", -1, False), SilverType("string")),
    (
        "total",
        ColumnType("numeric", "b", ((12 << 16) | 2) + 4, False),
        SilverType("decimal", 12, 2),
    ),
    ("currency", ColumnType("bpchar", "b", 7, False), SilverType("string")),
    ("placed_at", ColumnType("timestamptz", "b", -1, False), SilverType("timestamp")),
    ("note", ColumnType("text", "b", -1, False), SilverType("string")),
]
SHAPE = TableShape(
    "public", "orders", tuple(SilverColumn(n, pg, s, pg.name) for n, pg, s in COLUMNS), ("id",),
    ReplicaIdentity.DEFAULT,
)  # fmt: skip


def typed_rows(spark: SparkSession, ids: DataFrame, version: int) -> DataFrame:
    """Orders-like rows for `ids`, typed as silver stores them."""
    return ids.select(
        F.col("id").cast("long"),
        (F.col("id") % 1000).cast("long").alias("customer_id"),
        F.when(F.col("id") % 3 == 0, "shipped").otherwise("paid").alias("status"),
        ((F.col("id") % 100000) / 100 + version).cast("decimal(12,2)").alias("total"),
        F.lit("EUR").alias("currency"),
        F.timestamp_micros(F.lit(1_700_000_000_000_000) + F.col("id")).alias("placed_at"),
        F.concat(F.lit(f"note v{version} "), F.col("id").cast("string")).alias("note"),
    )


def bronze_changes(spark: SparkSession, rows: int, changes: int) -> tuple[DataFrame, DataFrame]:
    """(bronze-shaped changes, the final typed row or delete per key) for the benchmark."""
    n = changes
    g = spark.range(n).withColumn("kind", F.col("id") % 10)
    key = F.when(F.col("kind") < 7, (F.col("id") * 7919) % rows + 1).when(
        F.col("kind") < 9, F.lit(rows) + F.col("id") + 1).otherwise((F.col("id") * 104729) % rows + 1)  # fmt: skip
    g = g.withColumn("key", key).withColumn(
        "op", F.when(F.col("kind") < 7, "u").when(F.col("kind") < 9, "c").otherwise("d")
    )
    g = g.withColumn("commit_lsn", F.col("id") + 1_000_000).withColumn("seq", F.lit(0).cast("long"))
    values = typed_rows(spark, g.select(F.col("key").alias("id")), 1)
    text = F.to_json(F.struct(
        F.col("v.id").cast("string").alias("id"), F.col("v.customer_id").cast("string").alias("customer_id"),
        F.col("v.status").alias("status"), F.col("v.total").cast("string").alias("total"),
        F.col("v.currency").alias("currency"),
        F.date_format("v.placed_at", "yyyy-MM-dd HH:mm:ss.SSSSSS+00").alias("placed_at"),
        F.col("v.note").alias("note"),
    ))  # fmt: skip
    joined = g.join(values.select(F.col("id").alias("key"), F.struct("*").alias("v")), "key")
    bronze = joined.select(
        "op", F.lit(None).cast("string").alias("key"),
        F.when(F.col("op") == "d", F.to_json(F.struct(F.col("key").cast("string").alias("id")))).alias("before"),
        F.when(F.col("op") != "d", text).alias("after"),
        F.array().cast("array<string>").alias("unchanged"),
        F.struct(*conformed(SOURCE, {"ts_us": F.col("commit_lsn"), "lsn": F.col("commit_lsn")}))
        .alias("source"),
        "commit_lsn", "seq",
    )  # fmt: skip
    bronze = bronze.select(*conformed(BRONZE, {c: F.col(c) for c in bronze.columns}))
    final = joined.groupBy("key").agg(F.max_by(F.struct("op", "v"), "commit_lsn").alias("last"))
    return bronze, final.select("key", "last.op", "last.v")


def copy_table(src: str, dst: str) -> None:
    shutil.copytree(src, dst)


def files_rewritten(spark: SparkSession, path: str) -> str:
    row = DeltaTable.forPath(spark, path).history(1).select("operationMetrics").first()
    m = row[0] if row else {}
    return (f"files removed {m.get('numTargetFilesRemoved')}, added {m.get('numTargetFilesAdded')}, "
            f"deletion vectors added {m.get('numTargetDeletionVectorsAdded', '-')}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    args = parser.parse_args()
    spark = build_spark(SparkSettings(master="local[2]", conf={
        "spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false", "spark.driver.memory": "6g",
        "spark.ui.showConsoleProgress": "false", "spark.log.level": "WARN"}), "bench-silver")  # type: ignore[arg-type]  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-silver-"))
    try:
        product, baseline = str(root / "product"), str(root / "baseline")
        ensure_silver(spark, product, SHAPE)
        table = typed_rows(spark, spark.range(1, args.rows + 1), 0).select(
            "*", F.lit(0).cast("long").alias("_cdc_lsn"), F.lit(0).cast("long").alias("_cdc_seq"),
            F.lit("r").alias("_cdc_op"), F.current_timestamp().alias("_cdc_commit_ts"),
            F.lit(False).alias("_cdc_deleted"), F.lit(None).cast("map<string,string>").alias("_cdc_raw"),
            F.array().cast("array<string>").alias("_cdc_unavailable"))  # fmt: skip
        started = time.perf_counter()
        table.repartition(16).write.format("delta").mode("append").save(product)
        files = spark.read.format("delta").load(product).inputFiles()
        print(
            f"silver table: {args.rows:,} rows in {len(files)} files ({time.perf_counter() - started:.0f} s)"
        )
        copy_table(product, baseline)
        bronze, final = bronze_changes(spark, args.rows, args.changes)
        bronze = bronze.localCheckpoint()
        final = final.localCheckpoint()
        print(f"changes: {bronze.count():,} ({final.count():,} keys)")

        started = time.perf_counter()
        merge_changes(spark, product, SHAPE, bronze, SilverSettings())
        product_s = time.perf_counter() - started
        print(f"product silver step: {args.changes / product_s:,.0f} changes/s ({product_s:.1f} s); "
              f"{files_rewritten(spark, product)}")  # fmt: skip

        source = final.select("op", "v.*")
        started = time.perf_counter()
        (DeltaTable.forPath(spark, baseline).alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedDelete("s.op = 'd'")
         .whenMatchedUpdate(set={c: f"s.{c}" for c, _, _ in COLUMNS})
         .whenNotMatchedInsert("s.op <> 'd'", values={c: f"s.{c}" for c, _, _ in COLUMNS})
         .execute())  # fmt: skip
        baseline_s = time.perf_counter() - started
        print(f"plain Delta MERGE of the same rows: {args.changes / baseline_s:,.0f} changes/s "
              f"({baseline_s:.1f} s); {files_rewritten(spark, baseline)}")  # fmt: skip
        print(f"ratio (product / plain MERGE throughput): {baseline_s / product_s:.2f}")
        a = spark.read.format("delta").load(product).select(*[c for c, _, _ in COLUMNS])
        b = spark.read.format("delta").load(baseline).select(*[c for c, _, _ in COLUMNS])
        assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0, "results differ"
        print("both tables hold the same rows")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
