"""The Spark half of a run: staged files -> bronze -> silver, each resuming where it stopped."""

from __future__ import annotations

from pyspark.sql import SparkSession

from cdc_core.bronze import BronzeSummary, append_staged, pending_files
from cdc_core.config import Config
from cdc_core.lake import Lake
from cdc_core.pgtypes import TypeModes
from cdc_core.silver import SilverSettings, TableResult, apply_silver


def silver_settings(config: Config) -> SilverSettings:
    s = config.pipeline.silver
    modes = TypeModes(
        decimal=s.decimal_handling_mode, time_precision=s.time_precision_mode,
        interval=s.interval_handling_mode, binary=s.binary_handling_mode,
        hstore=s.hstore_handling_mode,
    )  # fmt: skip
    catalog = config.env.catalog
    return SilverSettings(modes, s.soft_delete, catalog.register, catalog.database)


def apply_staged(
    spark: SparkSession, lake: Lake, config: Config
) -> tuple[BronzeSummary, list[TableResult]]:
    """Append every staged file not yet in bronze, then merge every table's pending rows."""
    bronze = append_staged(spark, lake, pending_files(spark, lake))
    silver = apply_silver(spark, lake, list(config.pipeline.source.tables), silver_settings(config))
    return bronze, silver
