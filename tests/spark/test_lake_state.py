"""Watermarks read from a table's log agree with Delta's own history, checkpoints and all."""

from __future__ import annotations

import json
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc_core import lake_state


def test_the_log_reader_agrees_with_delta_history(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    rows = spark.range(1).withColumnRenamed("id", "n")
    for n in range(23):  # past two checkpoints (every 10 commits)
        metadata = {"mark": n} if n % 4 == 0 else {"other": n}
        with lake_state.committing(spark, metadata):
            rows.write.format("delta").mode("append").save(path)
    assert list((tmp_path / "t" / "_delta_log").glob("*.checkpoint.parquet"))

    readings = [
        lake_state.table_version(spark, path),
        lake_state.read_watermark(spark, path, "mark"),
        lake_state.watermark_depth(spark, path, "mark"),
        lake_state.watermark_depth(spark, path, "absent"),
        lake_state.read_watermark(spark, path, "other"),
    ]

    history = DeltaTable.forPath(spark, path).history().orderBy("version", ascending=False)
    commits = [(r.version, json.loads(r.userMetadata)) for r in history.collect()]
    marks = [(depth, m) for depth, (_, m) in enumerate(commits) if "mark" in m]
    from_history = [
        commits[0][0], marks[0][1], marks[0][0], None,
        next(m for _, m in commits if "other" in m),
    ]  # fmt: skip
    assert readings == from_history == [22, {"mark": 20}, 2, None, {"other": 22}]


def test_a_table_not_there_reads_as_none_and_version_minus_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "none")
    assert lake_state.table_version(spark, path) == -1
    assert lake_state.read_watermark(spark, path, "mark") is None


def test_only_paths_without_a_scheme_or_file_uris_are_local() -> None:
    assert lake_state.local_path("/lake/bronze") == Path("/lake/bronze")
    assert lake_state.local_path("file:///lake/bronze") == Path("/lake/bronze")
    assert lake_state.local_path("s3a://bucket/lake/bronze") is None
