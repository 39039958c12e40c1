"""One local SparkSession with Delta for the spark tier, built the way the product builds it."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType

import pytest
from pyspark.sql import SparkSession

from cdc_core.config import SparkSettings
from cdc_core.errors import SetupError
from tests.conftest import unavailable

TEST_SPARK = SparkSettings(
    master="local[2]",
    jars="resolve",
    conf=MappingProxyType(
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.log.level": "WARN",
        }
    ),
)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from cdc_core.spark import build_spark

    try:
        session = build_spark(TEST_SPARK, "cdc-tests")
    except SetupError as e:
        unavailable(f"no Spark with Delta for the spark tier: {e}")
    yield session
    session.stop()
