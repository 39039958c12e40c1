"""Data Docs that cannot be written to the lake's object store are said in the report, and
leave the verdict of the expectations as it is (the comparison was lost with them, exit 1)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.storage import S3Options
from cdc_core.validate_quality import Suite, run_quality

TABLE = TableName("public", "customers")


def test_docs_the_store_does_not_take_are_said_and_the_verdict_stands(
    spark: SparkSession,
) -> None:
    frame = spark.createDataFrame([(1, "Ann"), (2, None)], "id int, name string")
    suite = Suite(
        TABLE,
        (("ExpectColumnValuesToNotBeNull", {"column": "name"}, "validate.expectations[0]"),
         ("ExpectColumnValuesToBeUnique", {"column": "id"}, "key")),
        {"id": T.IntegerType(), "name": T.StringType()},
    )  # fmt: skip
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        store = S3Options(f"http://{host}:{port}", "us-east-1", "t", "t", ssl=False)
        report = run_quality([(suite, frame)], Lake("s3a://no-such-bucket/p", store))
    finally:
        server.stop()

    assert report.docs is not None
    assert report.docs.startswith("not written (")
    assert "NO_SUCH_BUCKET" in report.docs
    assert [(o.expectation, o.column, o.success) for o in report.failed] == [
        ("expect_column_values_to_not_be_null", "name", False)
    ]
    assert len(report.outcomes) == 4  # two declared types, two expectations


def test_no_table_to_check_names_no_docs(tmp_path: Path) -> None:
    """Every table's comparison failed: no suite runs, so no index is written to point at."""
    report = run_quality([], Lake(str(tmp_path / "lake")))
    assert report.docs == "not written (no table to check)"
    assert report.outcomes == []
    assert not (tmp_path / "lake").exists()
