"""catalog.register: each mirror's entry in Spark's catalog points at the mirror. A lake that
moved (runbook 7) left entries pointing at its old place, where readers kept finding the old
copy without a word; the entry is pointed at the mirror now. A table of that name the product
did not make (a managed one) is never dropped."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.silver_shape import SchemaChangeError, TableShape
from cdc_core.silver_table import _entry, register, same_place

SHAPE = TableShape("public", "OrderItems", (), ("id",), ReplicaIdentity.DEFAULT)
SPACED = TableShape("Sales Dept", "Order Items", (), ("id",), ReplicaIdentity.DEFAULT)


def mirror(spark: SparkSession, path: Path, rows: int) -> str:
    spark.range(rows).write.format("delta").save(str(path))
    return str(path)


def test_an_entry_left_at_the_lake_s_old_place_points_at_the_mirror(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = mirror(spark, tmp_path / "old", 3), mirror(spark, tmp_path / "new", 5)
    name = register(spark, old, SHAPE, "cdc_moved_{schema}")
    assert name == "`cdc_moved_public`.`OrderItems`"
    assert spark.table(name).count() == 3

    with caplog.at_level(logging.WARNING, logger="cdc_core.silver_table"):
        assert register(spark, new, SHAPE, "cdc_moved_{schema}") == name
    assert spark.table(name).count() == 5
    assert "pointed at file:" in caplog.text
    assert "it points at the mirror now" in caplog.text
    assert spark.read.format("delta").load(old).count() == 3  # only the entry was dropped

    shutil.rmtree(new)  # moved again, and the place it left is gone: the catalog alone says
    moved = mirror(spark, tmp_path / "again", 7)
    register(spark, moved, SHAPE, "cdc_moved_{schema}")
    assert spark.table(name).count() == 7
    kind, location = _entry(spark, "cdc_moved_public", "OrderItems")
    assert kind == "EXTERNAL"
    assert location is not None
    assert same_place(location, moved)


def test_a_managed_table_of_the_mirror_s_name_is_left_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    spark.sql("CREATE DATABASE IF NOT EXISTS cdc_taken_public")
    spark.range(4).write.format("delta").saveAsTable("cdc_taken_public.`OrderItems`")
    path = mirror(spark, tmp_path / "mirror", 2)

    with pytest.raises(SchemaChangeError, match=r"catalog entry cdc_taken_public\.OrderItems is "
                       r"a MANAGED table at .*not the mirror of public\.OrderItems"):  # fmt: skip
        register(spark, path, SHAPE, "cdc_taken_{schema}")
    assert spark.table("cdc_taken_public.`OrderItems`").count() == 4


def test_locations_compare_as_places() -> None:
    assert same_place("file:/lake/silver/t", "/lake/silver/t/")
    assert same_place("file:///lake/silver/t", "/lake/silver/t")
    assert same_place("s3://b/lake/t/", "s3://b/lake/t")
    assert not same_place("s3://b/lake/t", "s3://b/lake2/t")


def test_names_spark_s_catalog_refuses_are_registered_with_underscores(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's catalog refuses `Order Items` (INVALID_SCHEMA_OR_RELATION_NAME), which failed
    every batch of a pipeline capturing such a table with catalog.register on."""
    path = mirror(spark, tmp_path / "spaced", 6)
    assert register(spark, path, SPACED, "cdc_{schema}") == "`cdc_Sales_Dept`.`Order_Items`"
    assert spark.sql("SELECT count(*) FROM cdc_sales_dept.order_items").first() == (6,)
