"""Stage 4's side table: changes silver set aside (event.processing.failure.handling.mode warn or
skip), in the Delta table `_state/dead_letters`, written before the mirror's watermark passes them.

A change is set aside when silver cannot apply it (`silver_batch.typed_with`'s refusals: a key
value its silver type cannot hold, a value that is not PostgreSQL's text of its type; for a
table without a key, `silver_batch.multiset_refusals`: such a value in the row a change adds
or removes). Its row
holds the source table, the change's position as bronze has it (`commit_lsn`, `seq`, `lsn`),
its op, every value's text, the reason and when it was set aside. The table is partitioned by
`source_table`, so mirrors merged at once write apart; the write is a MERGE that inserts only
changes it does not hold yet, so a batch run again after a crash adds nothing.
"""

from __future__ import annotations

import logging
from typing import Literal

from delta.exceptions.captured import (  # its import makes PySpark raise these
    ConcurrentAppendException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.silver_batch import REFUSED

log = logging.getLogger(__name__)

FailureHandling = Literal["fail", "warn", "skip"]
_TEXT, _LONG, _TIME = T.StringType(), T.LongType(), T.TimestampType()
SCHEMA = T.StructType([
    T.StructField(name, kind) for name, kind in (
        ("source_table", _TEXT), ("op", _TEXT), ("commit_lsn", _LONG), ("seq", _LONG),
        ("lsn", _LONG), ("tx_id", _LONG), ("commit_ts", _TIME), ("old_key", _TEXT),
        ("values", T.MapType(_TEXT, _TEXT)), ("reason", _TEXT), ("change_hash", _TEXT),
        ("recorded_at", _TIME),
    )
])  # fmt: skip
_IDENTITY = ("source_table", "commit_lsn", "seq", "op", "change_hash")  # one change, once
_ATTEMPTS = 3
_CONFLICTS = (ConcurrentAppendException, ConcurrentTransactionException, ConcurrentWriteException,
              MetadataChangedException, ProtocolChangedException)  # fmt: skip
_WARN_LINES = 1000  # warn: lines logged per table and batch; a count says how many more


def dead_letters(typed: DataFrame, table: str) -> DataFrame:
    """The dead-letter rows of the typed changes `typed_with` refused (pure). A snapshot read
    has no position of its own (seq -1 for its whole group): `change_hash` tells apart the
    changes of one position, by their values."""
    refused = typed.where(F.col(REFUSED).isNotNull())
    values = F.col("_cdc_raw")
    old_key = F.col("_old_key_json") if "_old_key_json" in typed.columns else F.lit(None)
    lsn = F.col("_lsn") if "_lsn" in typed.columns else F.col("_cdc_lsn")
    return refused.select(
        F.lit(table).alias("source_table"), F.col("_cdc_op").alias("op"),
        F.col("_cdc_lsn").alias("commit_lsn"), F.col("_cdc_seq").alias("seq"),
        lsn.cast("bigint").alias("lsn"), F.col("_xid").cast("bigint").alias("tx_id"),
        F.col("_cdc_commit_ts").alias("commit_ts"), old_key.cast("string").alias("old_key"),
        values.alias("values"), F.col(REFUSED).alias("reason"),
        F.sha2(F.to_json(F.map_entries(values)), 256).alias("change_hash"),
        F.current_timestamp().alias("recorded_at"),
    )  # fmt: skip


def record(spark: SparkSession, lake: Lake, rows: DataFrame, table: str) -> int:
    """Insert the dead-letter `rows` of `table` the table does not hold yet (one MERGE, on the
    change's identity, restricted to the table's partition); returns how many it inserted.
    Mirrors merged at once may create the table together: the one that loses tries again."""
    for _ in range(_ATTEMPTS - 1):
        try:
            return _merge(spark, lake.dead_letters, rows, table)
        except _CONFLICTS:  # nothing committed: the MERGE runs again on what the other wrote
            log.info("%s: dead letters written again after a concurrent commit", table)
    return _merge(spark, lake.dead_letters, rows, table)


def _merge(spark: SparkSession, path: str, rows: DataFrame, table: str) -> int:
    (
        DeltaTable.createIfNotExists(spark).location(path).addColumns(SCHEMA)
        .partitionedBy("source_table").execute()
    )  # fmt: skip
    source = rows.dropDuplicates(list(_IDENTITY))
    on = " AND ".join([f"t.source_table = '{_quote(table)}'"]
                      + [f"t.`{c}` = s.`{c}`" for c in _IDENTITY])  # fmt: skip
    before = _held(spark, path, table)
    target = DeltaTable.forPath(spark, path)
    target.alias("t").merge(source.alias("s"), on).whenNotMatchedInsertAll().execute()
    return _held(spark, path, table) - before


def _held(spark: SparkSession, path: str, table: str) -> int:
    """The dead letters of `table` the table holds now: counted in its partition, since the
    newest commit's metrics may be another table's (mirrors merged at once write at once)."""
    rows = spark.read.format("delta").load(path)
    return rows.where(F.col("source_table") == table).count()


def report(table: str, rows: DataFrame, mode: FailureHandling, inserted: int) -> None:
    """warn: a line per change set aside (table, LSN, reason); skip: the count alone."""
    if mode == "skip":
        log.info("%s: %d changes silver cannot apply skipped (%d new in %s)",
                 table, rows.count(), inserted, "_state/dead_letters")  # fmt: skip
        return
    shown = rows.orderBy("commit_lsn", "seq").limit(_WARN_LINES + 1).collect()
    for row in shown[:_WARN_LINES]:
        log.warning("%s: change at LSN %s (commit %s, #%s, op %s) skipped, in "
                    "_state/dead_letters: %s", table, _lsn(row["lsn"]), _lsn(row["commit_lsn"]),
                    row["seq"], row["op"], row["reason"])  # fmt: skip
    if len(shown) > _WARN_LINES:
        log.warning("%s: and %d more changes skipped, in _state/dead_letters", table,
                    rows.count() - _WARN_LINES)  # fmt: skip


def _lsn(value: int | None) -> str:
    return "-" if value is None else str(Lsn(value))


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
