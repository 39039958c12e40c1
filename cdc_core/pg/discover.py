"""The captured tables when `source.tables` is omitted: found in the source's catalog.

Debezium captures every table the schema and table lists let through; so does a pipeline that
lists no tables, reading the catalog at the start of every run (and in the commands that need
the table set). A table created since the last run is then a table added to the pipeline: its
first snapshot is incremental (`start._plan`, "new tables"). A table dropped since is followed
until the changes made to it before the drop are in its mirror (`cdc_core.dropped`), then no
longer captured; its mirror keeps its last rows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import psycopg

from cdc_core.config import Config, PipelineConfig, SourceConfig, with_tables
from cdc_core.errors import ConfigError
from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import Connection
from cdc_core.pg.connect import connect

log = logging.getLogger("cdc_core.discover")

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")
_SYSTEM_PREFIXES = ("pg_toast", "pg_temp")  # pg_toast_temp_N too


@dataclass(frozen=True)
class CatalogTable:
    """A table of the source's catalog (`pg_class`), as discovery decides on it."""

    schema: str
    name: str
    kind: str  # relkind: r ordinary, p partitioned
    partition: bool  # relispartition: a partition of a partitioned table
    persistence: str = "p"  # relpersistence: p permanent, u unlogged, t temporary


_TABLES = """
SELECT n.nspname::text, c.relname::text, c.relkind::text, c.relispartition,
       c.relpersistence::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
ORDER BY 1, 2
"""


def is_system_schema(schema: str) -> bool:
    return schema in SYSTEM_SCHEMAS or schema.startswith(_SYSTEM_PREFIXES)


def captured_tables(
    rows: Iterable[CatalogTable], source: SourceConfig, *, own: Collection[TableName] = ()
) -> list[TableName]:
    """The tables of `rows` a source without `source.tables` captures, in schema and name
    order: permanent ordinary and partitioned tables outside the system schemas that the
    schema and table lists let through (anchored, ignoring case), less `own` (the product's
    signal and heartbeat tables). A partitioned table counts as one table, never its
    partitions: its publication sends their changes as its own (publish_via_partition_root).
    Unlogged and temporary tables write no WAL a slot could decode."""
    found = []
    for row in rows:
        table = TableName(row.schema, row.name)
        if row.kind not in ("r", "p") or row.partition or row.persistence != "p":
            continue
        if is_system_schema(row.schema) or table in own or not source.captures(table):
            continue
        found.append(table)
    return sorted(found, key=lambda t: (t.schema, t.name))


_NAME = r'(?:"(?:[^"]|"")+"|[^\s"(),;.]+)'
_WRITES = re.compile(
    rf"\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|MERGE\s+INTO)\s+(?:ONLY\s+)?"
    rf"({_NAME}(?:\s*\.\s*{_NAME}){{0,2}})",
    re.IGNORECASE,
)


def heartbeat_target(query: str | None) -> str | None:
    """The table `heartbeat.action.query` writes (INSERT, UPDATE, DELETE or MERGE: the name as
    written, resolved by the server's search path), or None."""
    found = _WRITES.match(query or "")
    return found.group(1) if found else None


def own_tables(conn: Connection, pipeline: PipelineConfig) -> set[TableName]:
    """The product's own tables on the source: the signal table and the heartbeat's, which a
    source without `source.tables` does not capture (list them to mirror them)."""
    own = set()
    if pipeline.snapshot.signal_data_collection is not None:
        own.add(pipeline.snapshot.signal_data_collection)
    target = heartbeat_target(pipeline.source.heartbeat_action_query)
    if target is not None:
        try:
            with conn.transaction():  # a name the server cannot parse is no table of ours
                row = conn.execute(
                    "SELECT n.nspname::text, c.relname::text FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
                    (target,),
                ).fetchone()
        except (
            psycopg.errors.SyntaxErrorOrAccessRuleViolation,
            psycopg.errors.FeatureNotSupported,
            psycopg.errors.DataException,
        ):
            row = None  # fmt: skip
        if row is not None:
            own.add(TableName(str(row[0]), str(row[1])))
    return own


def catalog_tables(conn: Connection) -> list[CatalogTable]:
    rows = conn.execute(_TABLES).fetchall()
    return [CatalogTable(str(s), str(n), str(k), bool(p), str(r)) for s, n, k, p, r in rows]


def discover(config: Config, conn: Connection | None = None) -> Config:
    """`config` with the tables it captures: as loaded when the pipeline file lists them, else
    found in the source's catalog now (on `conn`, or a connection of its own). A catalog that
    holds no table to capture is a configuration error (exit 2) naming the lists."""
    source = config.pipeline.source
    if not source.awaits_discovery:
        return config
    if conn is None:
        with connect(source.dsn) as own:
            return discover(config, own)
    found = captured_tables(catalog_tables(conn), source, own=own_tables(conn, config.pipeline))
    if not found:
        database = conn.info.dbname
        raise ConfigError(
            config.pipeline_file,
            source.tables_key,
            f"lets no table of database {database!r} through (schema.table of its ordinary and "
            "partitioned tables outside the system schemas, matched whole and ignoring case, "
            "less the signal and heartbeat tables): correct the expressions, or list the tables "
            "in source.tables",
        )
    return with_tables(config, found)


def describe(config: Config) -> str:
    """What a discovering source captures, for a log line or the doctor."""
    source = config.pipeline.source
    tables = ", ".join(map(str, source.tables))
    return f"source.tables omitted: {source.tables_key} lets {len(source.tables)} through: {tables}"
