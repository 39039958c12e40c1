"""The product's SparkSession writes and reads Delta with jars the project resolved itself."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core import jars

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("name", T.StringType(), True),
        T.StructField("amount", T.DecimalType(12, 2), True),
        T.StructField("at", T.TimestampType(), True),
    ]
)
ROWS = [
    (1, "Zoë", Decimal("10.50"), dt.datetime(2024, 1, 2, 3, 4, 5)),
    (2, "東京", None, None),
    (3, None, Decimal("-0.01"), dt.datetime(1999, 12, 31, 23, 59, 59)),
]


def test_a_delta_table_round_trips(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    written = spark.createDataFrame(ROWS, SCHEMA)
    written.write.format("delta").save(path)
    assert DeltaTable.isDeltaTable(spark, path)
    back = spark.read.format("delta").load(path)
    assert_df_equality(back, written, ignore_row_order=True, ignore_nullable=True)


def test_merge_through_the_delta_builder(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "m")
    spark.createDataFrame(ROWS, SCHEMA).write.format("delta").save(path)
    changes = spark.createDataFrame(
        [(2, "Osaka", Decimal("1.00"), None), (4, "new", None, None)], SCHEMA
    )
    (
        DeltaTable.forPath(spark, path).alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )  # fmt: skip
    expected = spark.createDataFrame(
        [ROWS[0], (2, "Osaka", Decimal("1.00"), None), ROWS[2], (4, "new", None, None)], SCHEMA
    )
    back = spark.read.format("delta").load(path)
    assert_df_equality(back, expected, ignore_row_order=True, ignore_nullable=True)


def test_the_jars_come_from_the_projects_own_cache(spark: SparkSession) -> None:
    added = spark.conf.get("spark.jars").split(",")
    cache = str(jars.cache_root())
    names = {Path(j).name for j in added}
    assert all(j.startswith(cache) for j in added), added
    assert any(n.startswith("delta-spark_2.13-") for n in names)
    assert any(n.startswith("postgresql-") for n in names)


def test_sessions_run_in_utc(spark: SparkSession) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_sessions_keep_enough_generated_classes_for_a_batch(spark: SparkSession) -> None:
    """Spark keeps 100 compiled classes by default; a batch of three mirrors runs about 400, so
    every batch would compile them all again (a static setting: only the JVM's start sets it)."""
    assert int(spark.conf.get("spark.sql.codegen.cache.maxEntries")) >= 1000


def test_each_in_session_keeps_commit_settings_per_thread_and_runs_every_item(
    spark: SparkSession, tmp_path: Path
) -> None:
    import json
    import threading

    from cdc_core.lake_state import committing, read_watermark
    from cdc_core.spark import each_in_session

    barrier = threading.Barrier(3, timeout=120)  # all three commit settings set at once

    def write(session: SparkSession, n: int) -> int:
        path = str(tmp_path / f"t{n}")
        with committing(session, {"mark": n}, app_id="each", version=n):
            barrier.wait()
            session.range(n + 1).write.format("delta").save(path)
        if n == 1:
            raise ValueError("item 1 fails")
        return n

    with pytest.raises(ValueError, match="item 1 fails"):
        each_in_session(spark, write, [0, 1, 2], threads=3)
    for n in (0, 1, 2):  # every item ran, each commit with its own thread's metadata
        assert read_watermark(spark, str(tmp_path / f"t{n}"), "mark") == {"mark": n}
        assert spark.read.format("delta").load(str(tmp_path / f"t{n}")).count() == n + 1
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert json.loads(json.dumps(each_in_session(spark, lambda s, n: n * 2, [1, 2, 3], 2))) == [
        2,
        4,
        6,
    ]


def test_expressions_built_once_serve_any_dataframe_of_any_session_and_thread(
    spark: SparkSession,
) -> None:
    """`built_once` keeps a builder's Spark expressions per arguments: one set, built once,
    types the DataFrames of every thread's own session at once, each by its own columns."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    from cdc_core.spark import built_once, each_in_session

    builds: list[tuple[str, int]] = []

    @built_once
    def shifted(name: str, *, by: int) -> tuple[Column, ...]:
        builds.append((name, by))
        return (F.col(name), (F.col(name) + F.lit(by)).alias(f"{name}_plus"))

    def use(session: SparkSession, n: int) -> list[tuple[int, int]]:
        rows = session.range(n).withColumnRenamed("id", "v").select(*shifted("v", by=10))
        other = session.range(2).withColumnRenamed("id", "v").select(*shifted("v", by=10))
        return sorted((r[0], r[1]) for r in rows.join(other, "v").collect())

    assert use(spark, 1) == [(0, 10)]  # built here (threads that miss at once may each build)
    found = each_in_session(spark, use, [3, 4, 5], threads=3)
    assert found == [[(0, 10), (1, 11)]] * 3  # a join of two DataFrames holding the same set
    assert spark.range(1).select(*shifted("id", by=1)).first() == (0, 1)
    assert builds == [("v", 10), ("id", 1)]  # four sessions, eight DataFrames: one build each


def test_a_spark_error_of_a_running_driver_is_not_taken_for_its_death(
    spark: SparkSession,
) -> None:
    """`driver_dying` asks the live JVM whether its SparkContext stopped: an error that left
    the driver running is the error itself, not a death (a probe that failed would say so)."""
    from pyspark.errors import AnalysisException

    from cdc_core.spark import driver_dying

    with pytest.raises(AnalysisException) as failed:
        spark.sql("SELECT * FROM no_such_table_anywhere").collect()
    assert not driver_dying(failed.value, spark, grace_s=0.3)
    assert not spark.sparkContext._jsc.sc().isStopped()  # type: ignore[union-attr]
