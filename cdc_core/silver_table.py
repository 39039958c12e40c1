"""The silver Delta tables themselves: creation, schema evolution in place, catalog registration."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.silver_shape import SchemaChangeError, TableShape

PROPERTIES = {
    "delta.enableChangeDataFeed": "true",  # consumers follow the mirror
    "delta.enableDeletionVectors": "true",  # MERGE marks rows instead of rewriting whole files
    "delta.enableTypeWidening": "true",  # int -> bigint and the like, in place
}
_WIDER: set[tuple[type[T.DataType], type[T.DataType]]] = {
    (T.ShortType, T.IntegerType), (T.ShortType, T.LongType), (T.IntegerType, T.LongType),
    (T.FloatType, T.DoubleType),
}  # fmt: skip


def sql_name(path: str) -> str:
    """A path-based table name for Spark SQL: delta.`path`."""
    return "delta.`" + path.replace("`", "``") + "`"


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ensure_silver(spark: SparkSession, path: str, shape: TableShape) -> None:
    """Create the mirror, or bring its schema to `shape`: add columns, widen types in place."""
    wanted = shape.spark_schema()
    if not DeltaTable.isDeltaTable(spark, path):
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(wanted)
        for key, value in PROPERTIES.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    existing = {f.name: f.dataType for f in DeltaTable.forPath(spark, path).toDF().schema.fields}
    added = [f for f in wanted.fields if f.name not in existing]
    if any(f.metadata for f in added):  # SQL cannot set field metadata; a schema merge can
        empty = spark.createDataFrame([], T.StructType(added))
        empty.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    elif added:
        columns = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE {sql_name(path)} ADD COLUMNS ({columns})")
    for f in wanted.fields:
        old = existing.get(f.name)
        if old is None or old == f.dataType:
            continue
        if not spark_widens(old, f.dataType):
            raise SchemaChangeError(
                f"table {shape.qualified}: column {f.name} is {old.simpleString()} in its silver "
                f"mirror but now needs {f.dataType.simpleString()}, which Delta cannot change in "
                "place. The mirror stops here; other tables go on. To move on, drop the silver "
                "table and take a new snapshot of it"
            )
        spark.sql(f"ALTER TABLE {sql_name(path)} ALTER COLUMN {quoted(f.name)} TYPE "
                  f"{f.dataType.simpleString()}")  # fmt: skip


def spark_widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta's type widening turns `old` into `new` without loss."""
    if (type(old), type(new)) in _WIDER:
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


def register(spark: SparkSession, path: str, shape: TableShape, database: str) -> str:
    """Register the mirror in the Spark catalog as `<database>.<table>`; returns the name.

    `database` may use {schema}: the default `cdc_{schema}` gives `cdc_public.customers`.
    """
    db = database.format(schema=shape.schema)
    name = f"{quoted(db)}.{quoted(shape.table)}"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {quoted(db)}")
    location = path.replace("'", "\\'")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{location}'")
    return name
