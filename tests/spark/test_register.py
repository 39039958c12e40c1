"""catalog.register: each mirror's entry in Spark's catalog points at the mirror. A lake that
moved (runbook 7) left entries pointing at its old place, where readers kept finding the old
copy without a word; the entry is pointed at the mirror now. A table of that name the product
did not make (a managed one) is never dropped."""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.bronze import record_schema
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.silver import SilverSettings, apply_silver
from cdc_core.silver_shape import SchemaChangeError, TableShape
from cdc_core.silver_table import _entry, register, same_place
from cdc_core.state import mirror_owner, owner_file, write_json
from tests.spark.test_silver_modes import RELATION, SHIFTS, insert, land

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


def lake_mirror(spark: SparkSession, root: Path, pipeline: str, rows: int) -> str:
    """A mirror at `<root>/silver/public/OrderItems` in the lake of `pipeline`."""
    write_json(owner_file(Lake(str(root))), {"pipeline": pipeline})
    return mirror(spark, Path(Lake(str(root)).silver(TableName("public", "OrderItems"))), rows)


def owner_of(lake: Path) -> Callable[[str], str | None]:
    return functools.partial(mirror_owner, Lake(str(lake)))


def test_an_entry_of_another_pipeline_s_mirror_is_left_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two pipelines whose mirrors take one catalog name used to take the entry from each
    other at every batch, each with a warning, and readers by name got either mirror."""
    first = lake_mirror(spark, tmp_path / "a", "orders", 3)
    second = lake_mirror(spark, tmp_path / "b", "billing", 5)
    name = register(spark, first, SHAPE, "cdc_two_{schema}", pipeline="orders",
                    owner=owner_of(tmp_path / "a"))  # fmt: skip

    with pytest.raises(SchemaChangeError, match=(
        r"catalog entry cdc_two_public\.OrderItems is the mirror of pipeline 'orders' at "
        r".*/a/silver/public/OrderItems, not the mirror of public\.OrderItems of pipeline "
        r"'billing' at .*/b/silver/public/OrderItems: give one of them its own "
        r"catalog.database")):  # fmt: skip
        register(spark, second, SHAPE, "cdc_two_{schema}", pipeline="billing",
                 owner=owner_of(tmp_path / "b"))  # fmt: skip
    assert spark.table(name).count() == 3  # still the first pipeline's


def test_an_entry_of_the_same_pipeline_s_lake_elsewhere_follows_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A lake copied to a new root (runbook 7) keeps its owner: the old copy still being
    there does not make it another pipeline's."""
    old = lake_mirror(spark, tmp_path / "old", "orders", 3)
    new = lake_mirror(spark, tmp_path / "new", "orders", 5)
    name = register(spark, old, SHAPE, "cdc_copied_{schema}", pipeline="orders",
                    owner=owner_of(tmp_path / "old"))  # fmt: skip
    register(spark, new, SHAPE, "cdc_copied_{schema}", pipeline="orders",
             owner=owner_of(tmp_path / "new"))  # fmt: skip
    assert spark.table(name).count() == 5


def test_a_batch_leaves_another_pipeline_s_entry_alone(spark: SparkSession, tmp_path: Path) -> None:
    """Through a batch's silver step (`apply_silver` with catalog.register on): the second
    pipeline's mirror stops, naming the entry; the first's entry and rows stay."""
    lakes = {name: Lake(str(tmp_path / name)) for name in ("orders", "billing")}
    results = {}
    for name, lake in lakes.items():
        write_json(owner_file(lake), {"pipeline": name})
        record_schema(lake, RELATION, 0)
        land(spark, lake, insert(100, 1, "04:05:06"))
        on = SilverSettings(register=True, database="cdc_batch_{schema}", pipeline=name)
        (results[name],) = apply_silver(spark, lake, [SHIFTS], on)
    assert results["orders"].error is None
    assert results["billing"].error is not None
    assert "is the mirror of pipeline 'orders'" in results["billing"].error
    kind, location = _entry(spark, "cdc_batch_public", "shifts")
    assert kind == "EXTERNAL"
    assert location is not None
    assert same_place(location, lakes["orders"].silver(SHIFTS))


def test_a_mirror_s_owner_is_read_from_its_lake(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    write_json(owner_file(lake), {"pipeline": "orders"})
    place = lake.silver(TableName("public", "t"))
    assert mirror_owner(lake, place) == "orders"
    assert mirror_owner(lake, f"file:{place}") == "orders"
    assert mirror_owner(lake, f"file://{place}/") == "orders"
    assert mirror_owner(lake, str(tmp_path / "gone" / "silver" / "public" / "t")) is None
    (tmp_path / "broken" / "_state").mkdir(parents=True)
    (tmp_path / "broken" / "_state" / "pipeline.json").write_text("{")
    assert mirror_owner(lake, str(tmp_path / "broken" / "silver" / "public" / "t")) is None


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
