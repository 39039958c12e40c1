"""The silver Delta tables themselves: creation, schema evolution in place, catalog registration."""

from __future__ import annotations

import logging
from collections.abc import Callable

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc_core.identifiers import catalog_name
from cdc_core.silver_shape import MULTISET_COLUMNS, SchemaChangeError, TableShape
from cdc_core.storage import plain_location

log = logging.getLogger(__name__)

PROPERTIES = {
    "delta.enableChangeDataFeed": "true",  # consumers follow the mirror
    "delta.enableDeletionVectors": "true",  # MERGE marks rows instead of rewriting whole files
    "delta.enableTypeWidening": "true",  # int -> bigint and the like, in place
}
# Delta keeps column names as Parquet's only under column mapping when they hold any of these;
# mapping by name is set on the mirrors that need it (older readers cannot read the others).
_MAPPED_CHARACTERS = frozenset(" ,;{}()\n\t=")
COLUMN_MAPPING = {"delta.columnMapping.mode": "name"}
_WIDER: set[tuple[type[T.DataType], type[T.DataType]]] = {
    (T.ShortType, T.IntegerType), (T.ShortType, T.LongType), (T.IntegerType, T.LongType),
    (T.FloatType, T.DoubleType),
}  # fmt: skip


def sql_name(path: str) -> str:
    """A path-based table name for Spark SQL: delta.`path`."""
    return "delta.`" + path.replace("`", "``") + "`"


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ensure_silver(
    spark: SparkSession, path: str, shape: TableShape, *, starting_over: bool = False
) -> bool:
    """Create the mirror, or bring its schema to `shape`: add columns, widen types in place.
    A schema it cannot take in place (a type Delta cannot widen, a key gained or lost, a column
    renamed only in case) stops the mirror, changing nothing; unless the batch is `starting_over`
    (it empties the mirror first: a TRUNCATE, or a table dropped and created again): then it is
    True, and the emptying write replaces the schema with the rows (`_empty`)."""
    wanted = shape.spark_schema()
    if not DeltaTable.isDeltaTable(spark, path):
        _warn_unknown(shape, {c.name for c in shape.columns})
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(wanted)
        mapping = COLUMN_MAPPING if needs_column_mapping(wanted.names) else {}
        for key, value in (PROPERTIES | mapping).items():
            builder = builder.property(key, value)
        builder.execute()
        return False
    existing = {f.name: f.dataType for f in DeltaTable.forPath(spark, path).toDF().schema.fields}
    added = [f for f in wanted.fields if f.name not in existing]
    misfit = _misfit(shape, existing, wanted, added)
    if misfit is not None:
        if starting_over:
            _warn_unknown(shape, {c.name for c in shape.columns})
            if needs_column_mapping(wanted.names):
                _map_columns_by_name(spark, path)
            return True
        raise SchemaChangeError(misfit)
    _warn_unknown(shape, {f.name for f in added})
    if needs_column_mapping([f.name for f in added]):
        _map_columns_by_name(spark, path)
    if any(f.metadata for f in added):  # SQL cannot set field metadata; a schema merge can
        empty = spark.createDataFrame([], T.StructType(added))
        empty.write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    elif added:
        columns = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE {sql_name(path)} ADD COLUMNS ({columns})")
    for f in wanted.fields:
        old = existing.get(f.name)
        if old is not None and old != f.dataType:
            spark.sql(f"ALTER TABLE {sql_name(path)} ALTER COLUMN {quoted(f.name)} TYPE "
                      f"{f.dataType.simpleString()}")  # fmt: skip
    return False


def _misfit(
    shape: TableShape, existing: dict[str, T.DataType], wanted: T.StructType,
    added: list[T.StructField],
) -> str | None:  # fmt: skip
    """Why the mirror's schema (`existing`) cannot become `wanted` in place, or None."""
    multiset = MULTISET_COLUMNS.names[0] in existing
    if multiset == bool(shape.key):
        return key_changed(shape)
    folded = {n.lower(): n for n in existing}
    clash = next((f.name for f in added if f.name.lower() in folded), None)
    if clash is not None:  # Delta would take them for one column
        return (
            f"table {shape.qualified}: column {clash} differs only in case from its silver "
            f"mirror's column {folded[clash.lower()]}, and Spark and Delta take them for one "
            "column. The mirror stops here; other tables go on. To move on, "
            "drop the silver table and take a new snapshot of it "
            f"(`cdc snapshot --table {shape.qualified}`)"
        )
    for f in wanted.fields:
        old = existing.get(f.name)
        if old is not None and old != f.dataType and not spark_widens(old, f.dataType):
            return (
                f"table {shape.qualified}: column {f.name} is {old.simpleString()} in its silver "
                f"mirror but now needs {f.dataType.simpleString()}, which Delta cannot change in "
                "place. The mirror stops here; other tables go on. To move on, drop the silver "
                "table and take a new snapshot of it"
            )
    return None


def key_changed(shape: TableShape) -> str:
    """Why a mirror cannot go between rows by key and a multiset of rows in place."""
    t = shape.qualified
    if shape.key:
        what = (f"table {t} has a primary key ({', '.join(shape.key)}) now, and its silver mirror "
                "is a multiset of rows without one")  # fmt: skip
        back = "drop the primary key again"
    else:
        key = ", ".join(shape.keyed_by) or "?"
        what = (
            f"table {t} lost its primary key ({key}), and its silver mirror is keyed by it "
            "(UPDATE and DELETE on the source fail too unless its replica identity is FULL)"
        )
        back = f"add the primary key back (ALTER TABLE {t} ADD PRIMARY KEY ({key}))"
    return (
        f"{what}. The mirror stops here; other tables go on. To move on, {back} and the mirror "
        "goes on where it stopped, or drop the silver table and take a new snapshot of it "
        f"(`cdc snapshot --table {t}`)"
    )


def _warn_unknown(shape: TableShape, created: set[str]) -> None:
    for c in shape.columns:
        if c.unknown and c.name in created:
            log.warning(
                "table %s: column %s has type %s, which cdc-lake does not know (an extension's "
                "type): its silver column holds the exact text PostgreSQL prints for it (string)",
                shape.qualified, c.name, c.type_name,
            )  # fmt: skip


def needs_column_mapping(names: list[str]) -> bool:
    """Whether Delta can keep these column names only under column mapping."""
    return any(not _MAPPED_CHARACTERS.isdisjoint(name) for name in names)


def _map_columns_by_name(spark: SparkSession, path: str) -> None:
    detail = DeltaTable.forPath(spark, path).detail().first()
    if detail is None or detail["properties"].get("delta.columnMapping.mode", "none") == "none":
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in COLUMN_MAPPING.items())
        spark.sql(f"ALTER TABLE {sql_name(path)} SET TBLPROPERTIES ({properties})")


def spark_widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta's type widening turns `old` into `new` without loss."""
    if (type(old), type(new)) in _WIDER:
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


def register(
    spark: SparkSession, path: str, shape: TableShape, database: str, *,
    pipeline: str | None = None, owner: Callable[[str], str | None] | None = None,
) -> str:  # fmt: skip
    """Register the mirror in the Spark catalog as `<database>.<table>`; returns the name.

    `database` may use {schema}: the default `cdc_{schema}` gives `cdc_public.customers`.
    Characters Spark's catalog refuses in names become `_` (`catalog_name`).
    An entry of that name the product made before (external) that points elsewhere, where the
    lake was before it moved, is pointed at the mirror, with a warning; one the product did not
    make (a managed table) is left alone, and the run stops naming it. So does an entry that
    is the mirror of another pipeline (`owner`: the pipeline whose lake holds a mirror location,
    None when no lake is there; `pipeline`: this one): the two would take the entry from each
    other at every batch, and readers by name would get either mirror.
    """
    db, table = catalog_name(database.format(schema=shape.schema)), catalog_name(shape.table)
    name = f"{quoted(db)}.{quoted(table)}"
    seen = (spark.sparkContext.applicationId, name, path)
    if seen in _REGISTERED:
        return name
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {quoted(db)}")
    location = path.replace("'", "\\'")
    create = f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{location}'"
    spark.sql(create)
    kind, found = _entry(spark, db, table)
    if found is not None and not same_place(found, path):
        if kind != "EXTERNAL":
            raise SchemaChangeError(
                f"catalog entry {db}.{table} is a {kind or 'catalog'} table at {found}, "
                f"not the mirror of {shape.qualified} at {path}: drop or rename it, or set "
                "catalog.database to register the mirrors elsewhere"
            )
        other = owner(found) if owner is not None and pipeline is not None else None
        if other is not None and other != pipeline:
            raise SchemaChangeError(
                f"catalog entry {db}.{table} is the mirror of pipeline {other!r} at {found}, not "
                f"the mirror of {shape.qualified} of pipeline {pipeline!r} at {path}: give one "
                "of them its own catalog.database. If that lake is this pipeline's own from "
                f"before it was renamed, drop the entry (DROP TABLE {db}.{table}: an external "
                "table, no data is removed)"
            )
        log.warning("catalog entry %s.%s pointed at %s, not at the mirror %s (the lake "
                    "moved); it points at the mirror now", db, table, found, path)  # fmt: skip
        spark.sql(f"DROP TABLE {name}")  # an external table's entry only: no data is removed
        spark.sql(create)
    _REGISTERED.add(seen)
    return name


_REGISTERED: set[tuple[str, str, str]] = set()  # (application, name, path) found in place


def _entry(spark: SparkSession, database: str, table: str) -> tuple[str | None, str | None]:
    """The catalog entry's type (EXTERNAL, MANAGED) and location, from the catalog alone:
    `DESCRIBE` would read the Delta table there, and fails when the old location is gone."""
    pattern = table.replace("'", "\\'")
    rows = spark.sql(f"SHOW TABLE EXTENDED IN {quoted(database)} LIKE '{pattern}'").collect()
    info = {}
    for row in rows:
        if str(row["tableName"]).lower() == table.lower():  # the catalog may fold case
            for line in str(row["information"]).splitlines():
                key, _, value = line.partition(": ")
                info[key] = value
    return info.get("Type"), info.get("Location")


def same_place(a: str, b: str) -> bool:
    """Whether two table locations name one place: `file:/x`, `file:///x` and `/x/` are `/x`."""
    return plain_location(a) == plain_location(b)
