"""Benchmark: one-change silver batches into mirrors of many columns, against a plain Delta MERGE.

    python benchmarks/wide_merge.py [--widths 7 100 500] [--rows 10000] [--batches 8]

For each width, a mirror of `rows` rows (a bigint key and columns of bigint, text, numeric and
timestamptz in turn) gets `batches` batches of one UPDATE each through the product's silver
step (JSON parsing, typing, the newest change per key, the guarded MERGE). The baseline,
measured batch by batch in the same run, is a plain Delta MERGE (update all, insert all) of the
same row, already typed, into a table of the same width. Both run on conf/local.yaml's Spark
settings (what a local run of the product gets), on `local[2]`. Prints each batch's seconds and
the medians of the batches after the third (the JVM warms up over the first ones), and their
ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_core.config import load_env
from cdc_core.envelope import BRONZE, SOURCE, conformed
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pgtypes import ColumnType, SilverType
from cdc_core.silver import SilverSettings, merge_changes
from cdc_core.silver_shape import SilverColumn, TableShape
from cdc_core.silver_table import ensure_silver
from cdc_core.spark import build_spark

KINDS = [  # PostgreSQL type, silver type; column i > 0 is of kind i % 4
    (ColumnType("int8", "b", -1, False), SilverType("long")),
    (ColumnType("text", "b", -1, False), SilverType("string")),
    (ColumnType("numeric", "b", ((12 << 16) | 2) + 4, False), SilverType("decimal", 12, 2)),
    (ColumnType("timestamptz", "b", -1, False), SilverType("timestamp")),
]
WARM = 3  # batches left out of the medians


def shape_of(width: int) -> TableShape:
    columns = [SilverColumn("id", KINDS[0][0], KINDS[0][1], "int8")]
    for i in range(1, width):
        pg, silver = KINDS[i % 4]
        columns.append(SilverColumn(f"c{i}", pg, silver, pg.name))
    return TableShape("public", f"wide{width}", tuple(columns), ("id",), ReplicaIdentity.DEFAULT)


def typed_values(shape: TableShape, key: Column, version: int) -> list[Column]:
    """Each column's value for `key`, typed as silver stores it."""
    out = [key.cast("long").alias("id")]
    for i, c in enumerate(shape.columns[1:], start=1):
        kind = i % 4
        if kind == 0:
            value = key.cast("long") * 1000 + version
        elif kind == 1:
            value = F.concat(F.lit(f"t{version}-"), key.cast("string"))
        elif kind == 2:
            value = (key + version).cast("decimal(12,2)")
        else:
            value = F.timestamp_micros(F.lit(1_700_000_000_000_000) + key + version)
        out.append(value.alias(c.name))
    return out


def text_values(shape: TableShape, key: int, version: int) -> dict[str, str]:
    """`typed_values` as pgoutput's text, the way bronze's `after` holds it."""
    out = {"id": str(key)}
    for i, c in enumerate(shape.columns[1:], start=1):
        kind = i % 4
        if kind == 0:
            out[c.name] = str(key * 1000 + version)
        elif kind == 1:
            out[c.name] = f"t{version}-{key}"
        elif kind == 2:
            out[c.name] = f"{key + version}.00"
        else:
            micros = 1_700_000_000_000_000 + key + version
            seconds, fraction = divmod(micros, 1_000_000)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
            out[c.name] = f"{stamp}.{fraction:06d}+00"
    return out


def one_update(spark: SparkSession, shape: TableShape, key: int, version: int) -> DataFrame:
    """A bronze row: an UPDATE of `key` carrying every column."""
    lsn = 2_000_000 + version
    row = spark.range(1).select(
        F.lit("u").alias("op"), F.lit(None).cast("string").alias("key"),
        F.lit(None).cast("string").alias("before"),
        F.lit(json.dumps(text_values(shape, key, version))).alias("after"),
        F.array().cast("array<string>").alias("unchanged"),
        F.struct(*conformed(SOURCE, {"ts_us": F.lit(lsn).cast("long"), "lsn": F.lit(lsn).cast("long")}))
        .alias("source"),
        F.lit(lsn).cast("long").alias("commit_lsn"), F.lit(0).cast("long").alias("seq"),
    )  # fmt: skip
    return row.select(*conformed(BRONZE, {c: F.col(c) for c in row.columns}))


def run_width(spark: SparkSession, root: Path, width: int, rows: int, batches: int) -> None:
    shape = shape_of(width)
    product, baseline = str(root / f"product{width}"), str(root / f"baseline{width}")
    ensure_silver(spark, product, shape)
    table = spark.range(1, rows + 1).select(*typed_values(shape, F.col("id"), 0))
    table.select(
        "*", F.lit(0).cast("long").alias("_cdc_lsn"), F.lit(0).cast("long").alias("_cdc_seq"),
        F.lit("r").alias("_cdc_op"), F.current_timestamp().alias("_cdc_commit_ts"),
        F.lit(False).alias("_cdc_deleted"), F.lit(None).cast("map<string,string>").alias("_cdc_raw"),
        F.array().cast("array<string>").alias("_cdc_unavailable"),
    ).coalesce(1).write.format("delta").mode("append").save(product)  # fmt: skip
    table.coalesce(1).write.format("delta").save(baseline)
    product_s, baseline_s = [], []
    for version in range(1, batches + 1):
        key = 100 + version
        bronze = one_update(spark, shape, key, version)
        started = time.perf_counter()
        merge_changes(spark, product, shape, bronze, SilverSettings())
        product_s.append(time.perf_counter() - started)
        source = spark.range(1).select(*typed_values(shape, F.lit(key), version))
        started = time.perf_counter()
        (DeltaTable.forPath(spark, baseline).alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())  # fmt: skip
        baseline_s.append(time.perf_counter() - started)
    names = [c.name for c in shape.columns]
    a = spark.read.format("delta").load(product).select(*names)
    b = spark.read.format("delta").load(baseline).select(*names)
    assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0, "results differ"
    p, q = statistics.median(product_s[WARM:]), statistics.median(baseline_s[WARM:])
    print(f"{width} columns: product {p:.2f} s, plain MERGE {q:.2f} s, ratio {q / p:.2f} "
          f"(each batch: product {[round(s, 1) for s in product_s]}, "
          f"plain {[round(s, 1) for s in baseline_s]}); both tables hold the same rows", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[7, 100, 500])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    if args.batches <= WARM:
        parser.error(f"--batches must be more than {WARM}")
    local = load_env()[0].spark  # conf/local.yaml: what a local run of the product gets
    conf = dict(local.conf) | {"spark.driver.memory": "4g"}
    spark = build_spark(dataclasses.replace(local, master="local[2]", conf=conf), "bench-wide")
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-wide-"))
    try:
        for width in args.widths:
            run_width(spark, root, width, args.rows, args.batches)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
