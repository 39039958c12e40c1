"""Watermarks read from a local table's log agree with Delta's own history, checkpoints and all."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core import lake_state


def test_the_log_reader_agrees_with_delta_history(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    rows = spark.range(1).withColumnRenamed("id", "n")
    for n in range(23):  # past two checkpoints (every 10 commits)
        metadata = {"mark": n} if n % 4 == 0 else {"other": n}
        with lake_state.committing(spark, metadata):
            rows.write.format("delta").mode("append").save(path)
    assert list((tmp_path / "t" / "_delta_log").glob("*.checkpoint.parquet"))

    def readings() -> list[object]:
        return [
            lake_state.table_version(spark, path),
            lake_state.read_watermark(spark, path, "mark"),
            lake_state.watermark_depth(spark, path, "mark"),
            lake_state.watermark_depth(spark, path, "absent"),
            lake_state.read_watermark(spark, path, "other"),
        ]

    from_the_log = readings()
    monkeypatch.setattr(lake_state, "local_path", lambda _: None)  # as for s3a:// tables
    from_history = readings()

    assert from_the_log == from_history == [22, {"mark": 20}, 2, None, {"other": 22}]


def test_only_paths_without_a_scheme_or_file_uris_are_local() -> None:
    assert lake_state.local_path("/lake/bronze") == Path("/lake/bronze")
    assert lake_state.local_path("file:///lake/bronze") == Path("/lake/bronze")
    assert lake_state.local_path("s3a://bucket/lake/bronze") is None
