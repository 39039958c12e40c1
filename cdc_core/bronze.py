"""Stage 3: staged change files -> one bronze Delta table of Debezium envelopes, idempotent.

Staged files are decoded on executors (`mapInArrow`, `cdc_core.envelope`) and appended in LSN
order. Each append carries Delta's `txnAppId`/`txnVersion` (the last file's end LSN), so
appending a file again is skipped by Delta itself, and records the same position in the
commit's metadata, from which the next run knows where to resume. The Relation descriptors of
every file go to the schema history under `_state/schemas/` first, so silver can type any
row it reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core import faults
from cdc_core.envelope import BRONZE, DEFAULT_PLACEHOLDER, StagedContext, decode_partition
from cdc_core.events import RelationDescriptor
from cdc_core.lake import Lake
from cdc_core.lake_state import committing, read_watermark
from cdc_core.lsn import ZERO, Lsn
from cdc_core.silver_table import quoted, sql_name
from cdc_core.spark import Spark
from cdc_core.stager import (
    StagedFile,
    damaged_in_spark,
    read_metadata,
    relations_of,
    staged_files,
)
from cdc_core.state import schema_history, schemas_dir, write_text
from cdc_core.unavailable import Placeholder

CAPTURE_APP = "cdc-capture"  # txnAppId of appends from staged files
WATERMARK = "bronze_staged_end"
TRANSACTIONS_WATERMARK = "transactions_staged_end"
STATS_COLUMNS = "commit_lsn,seq,op"
DATA_OPS = ("c", "u", "d", "t")  # the events transaction metadata counts (not op=m messages)
_COLLECTION = T.StructType(
    [T.StructField("data_collection", T.StringType()), T.StructField("event_count", T.LongType())]
)
TRANSACTIONS = T.StructType(
    [
        T.StructField("status", T.StringType()),  # BEGIN or END
        T.StructField("id", T.StringType()),  # <txId>:<commit LSN>, as in the events' block
        T.StructField("ts_ms", T.LongType()),  # the transaction's commit time
        T.StructField("event_count", T.LongType()),  # END only
        T.StructField("data_collections", T.ArrayType(_COLLECTION)),  # END only, per schema.table
        T.StructField("commit_lsn", T.LongType()),
        T.StructField("txId", T.LongType()),
        T.StructField("staged_file", T.StringType()),
    ]
)


@dataclass(frozen=True)
class BronzeOptions:
    """Debezium's envelope options that shape bronze."""

    transaction_metadata: bool = False  # provide.transaction.metadata
    placeholder: Placeholder = DEFAULT_PLACEHOLDER  # unavailable.value.placeholder
    skipped: frozenset[str] = frozenset()  # skipped.operations: events never in bronze
    skip_unchanged: bool = False  # skip.messages.without.change


@dataclass(frozen=True)
class BronzeSummary:
    """What one bronze step appended."""

    files: int
    changes: int
    end: Lsn | None

    def describe(self) -> str:
        if not self.files:
            return "bronze: nothing new"
        return f"bronze: {self.changes} changes from {self.files} staged files (up to {self.end})"


def ensure_bronze(spark: SparkSession, lake: Lake) -> None:
    """Create the bronze table if missing (partitioned by table, statistics on the order), or
    add the columns a newer version of the envelope has."""
    if DeltaTable.isDeltaTable(spark, lake.bronze):
        added = _missing(DeltaTable.forPath(spark, lake.bronze).toDF().schema, BRONZE)
        if added:
            columns = ", ".join(f"{name} {t.simpleString()}" for name, t in added)
            spark.sql(f"ALTER TABLE {sql_name(lake.bronze)} ADD COLUMNS ({columns})")
        return
    (
        DeltaTable.createIfNotExists(spark)
        .location(lake.bronze)
        .addColumns(BRONZE)
        .partitionedBy("source_table")
        .property("delta.dataSkippingStatsColumns", STATS_COLUMNS)
        .execute()
    )


def _missing(
    existing: T.StructType, wanted: T.StructType, prefix: str = ""
) -> list[tuple[str, T.DataType]]:
    """The fields of `wanted` that `existing` lacks, a struct's own fields too, as quoted
    (dotted) names and types for ALTER TABLE ADD COLUMNS."""
    have = {f.name: f.dataType for f in existing.fields}
    out: list[tuple[str, T.DataType]] = []
    for f in wanted.fields:
        name, had = f"{prefix}{quoted(f.name)}", have.get(f.name)
        if had is None:
            out.append((name, f.dataType))
        elif isinstance(f.dataType, T.StructType) and isinstance(had, T.StructType):
            out += _missing(had, f.dataType, f"{name}.")
    return out


def applied_end(spark: Spark, lake: Lake) -> Lsn:
    """End LSN of the last staged file in bronze."""
    mark = read_watermark(spark, lake.bronze, WATERMARK)
    return Lsn.parse(str(mark[WATERMARK])) if mark else ZERO


def pending_files(spark: Spark, lake: Lake) -> list[StagedFile]:
    end = applied_end(spark, lake)
    return [f for f in staged_files(lake.changes) if f.end > end]


def append_staged(
    spark: SparkSession, lake: Lake, files: Sequence[StagedFile], *, max_changes: int = 5_000_000,
    options: BronzeOptions = BronzeOptions(),
) -> BronzeSummary:  # fmt: skip
    """Append `files` (in LSN order) to bronze, in commits of at most about `max_changes`.
    With transaction metadata, each group's BEGIN/END events are committed first (to their own
    table, with their own watermark), so a crash between the two commits repeats neither."""
    if not files:
        return BronzeSummary(0, 0, None)
    ensure_bronze(spark, lake)
    total = 0
    for group, changes in _groups(lake, files, max_changes):
        try:
            _append_group(spark, lake, group, options)
        except Exception as e:  # a file whose pages no longer decode: named, with the way out
            damaged = damaged_in_spark(e, lake.changes)
            if damaged is None:
                raise
            raise damaged from e
        total += changes
    return BronzeSummary(len(files), total, files[-1].end)


def _append_group(
    spark: SparkSession, lake: Lake, group: Sequence[StagedFile], options: BronzeOptions
) -> None:
    """One commit of `append_staged`."""
    contexts = {str(f): staged_context(lake, f) for f in group}
    record_schemas(lake, contexts.values())
    staged = (
        spark.read.parquet(*(str(lake.changes / str(f)) for f in group))
        .withColumn("_file", F.col("_metadata.file_name"))
    )  # fmt: skip
    decode = functools.partial(
        decode_partition, context=contexts, placeholder=options.placeholder,
        skipped=options.skipped, skip_unchanged=options.skip_unchanged,
    )  # fmt: skip
    envelopes = staged.mapInArrow(decode, BRONZE)
    end = group[-1].end
    if options.transaction_metadata:
        envelopes = with_transaction_blocks(envelopes).persist(StorageLevel.MEMORY_AND_DISK)
        _append_transactions(spark, lake, envelopes, group)
        faults.point("bronze.between_commits")  # transactions committed, bronze not yet
    metadata = {WATERMARK: str(end), "staged_files": [f.id for f in group]}
    faults.point("bronze.before_commit")
    with committing(spark, metadata):
        (
            envelopes.write.format("delta").mode("append")
            .option("txnAppId", CAPTURE_APP).option("txnVersion", end.value)
            .save(lake.bronze)
        )  # fmt: skip
    envelopes.unpersist()
    faults.point("bronze.after_commit")


def with_transaction_blocks(envelopes: DataFrame) -> DataFrame:
    """Each data change's `transaction` block: id `<txId>:<commit LSN>`, its position among the
    transaction's events (`total_order`) and among those of its table (`data_collection_order`),
    both from 1. A primary-key change's `d` comes before its `c`. Messages have none."""
    is_data = F.col("op").isin(*DATA_OPS) & F.col("source.txId").isNotNull()
    order = [F.col("seq"), F.when(F.col("op") == "c", 1).otherwise(0), F.col("source_table")]
    total = Window.partitionBy("commit_lsn", is_data).orderBy(*order)
    per_table = Window.partitionBy("commit_lsn", is_data, "source_table").orderBy(*order)
    block = F.struct(
        F.concat_ws(":", F.col("source.txId").cast("string"), F.col("commit_lsn").cast("string"))
        .alias("id"),
        F.row_number().over(total).cast("long").alias("total_order"),
        F.row_number().over(per_table).cast("long").alias("data_collection_order"),
    )  # fmt: skip
    return envelopes.withColumn("transaction", F.when(is_data, block))


def transaction_events(envelopes: DataFrame) -> DataFrame:
    """A BEGIN and an END event per transaction with data changes in `envelopes`."""
    data = envelopes.where(F.col("transaction").isNotNull())
    per_table = data.groupBy(
        "commit_lsn", "transaction.id", "source.txId", "source.ts_ms", "staged_file",
        "source_table",
    ).agg(F.count(F.lit(1)).alias("n"))  # fmt: skip
    collection = F.struct(F.col("source_table").alias("data_collection"),
                          F.col("n").alias("event_count"))  # fmt: skip
    tx = per_table.groupBy("commit_lsn", "id", "txId", "ts_ms", "staged_file").agg(
        F.sum("n").alias("event_count"), F.sort_array(F.collect_list(collection)).alias("dc")
    )
    no_count = F.lit(None).cast("long")
    no_collections = F.lit(None).cast(TRANSACTIONS["data_collections"].dataType)
    begin = tx.select(F.lit("BEGIN").alias("status"), "id", "ts_ms",
                      no_count.alias("event_count"), no_collections.alias("data_collections"),
                      "commit_lsn", "txId", "staged_file")  # fmt: skip
    end = tx.select(F.lit("END").alias("status"), "id", "ts_ms", "event_count",
                    F.col("dc").alias("data_collections"), "commit_lsn", "txId",
                    "staged_file")  # fmt: skip
    return begin.unionByName(end)


def _append_transactions(
    spark: SparkSession, lake: Lake, envelopes: DataFrame, group: Sequence[StagedFile]
) -> None:
    """Commit the BEGIN/END events of the files in `group` not yet in the transactions table."""
    mark = read_watermark(spark, lake.transactions, TRANSACTIONS_WATERMARK)
    done = Lsn.parse(str(mark[TRANSACTIONS_WATERMARK])) if mark else ZERO
    todo = [f for f in group if f.end > done]
    if not todo:
        return
    if not DeltaTable.isDeltaTable(spark, lake.transactions):
        DeltaTable.createIfNotExists(spark).location(lake.transactions).addColumns(
            TRANSACTIONS
        ).execute()
    events = transaction_events(envelopes.where(F.col("staged_file").isin([f.id for f in todo])))
    end = todo[-1].end
    with committing(spark, {TRANSACTIONS_WATERMARK: str(end)}):
        (
            events.write.format("delta").mode("append")
            .option("txnAppId", CAPTURE_APP).option("txnVersion", end.value)
            .save(lake.transactions)
        )  # fmt: skip


def _groups(
    lake: Lake, files: Sequence[StagedFile], max_changes: int
) -> Iterator[tuple[list[StagedFile], int]]:
    group: list[StagedFile] = []
    changes = 0
    for f in files:
        n = int(read_metadata(lake.changes / str(f))["changes"])  # type: ignore[call-overload]
        if group and changes + n > max_changes:
            yield group, changes
            group, changes = [], 0
        group.append(f)
        changes += n
    if group:
        yield group, changes


def staged_context(lake: Lake, staged: StagedFile) -> StagedContext:
    """What decoding a staged file's rows needs: its footer."""
    path = lake.changes / str(staged)
    meta = read_metadata(path)
    source = meta.get("source") or {}
    assert isinstance(source, dict)
    return StagedContext(
        staged_file=staged.id,
        relations=relations_of(path),
        database=str(source.get("database", "")),
        pipeline=str(source.get("pipeline", "")),
        staged_at_us=int(meta["staged_at_us"]),  # type: ignore[call-overload]
        first_lsn=staged.start.value,
    )


def fingerprint(descriptor: RelationDescriptor) -> str:
    """Identity of a table's shape, stable across runs (versions count per run only)."""
    data = descriptor.to_json()
    data.pop("version")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def record_schemas(lake: Lake, contexts: Iterable[StagedContext]) -> None:
    """Write each descriptor the schema history does not have at its place (idempotent)."""
    for ctx in contexts:
        for descriptor in sorted(ctx.relations.values(), key=lambda d: d.version):
            record_schema(lake, descriptor, ctx.first_lsn)


def record_schema(lake: Lake, descriptor: RelationDescriptor, first_lsn: int) -> None:
    """Record a table's shape as seen from `first_lsn` on, unless the table already had that
    shape then. A shape can come back (a key dropped and added again): it is recorded again."""
    folder = schemas_dir(lake)
    folder.mkdir(parents=True, exist_ok=True)
    table = f"{descriptor.schema}.{descriptor.table}"
    shape = fingerprint(descriptor)
    earlier = [(lsn, d) for lsn, d in schema_history(lake, table) if lsn <= first_lsn]
    if earlier and fingerprint(earlier[-1][1]) == shape:
        return
    path = folder / f"{shape}-{first_lsn:016x}.json"  # a replay writes the same file again
    entry = {
        "table": table,
        "first_lsn": first_lsn,
        "descriptor": descriptor.to_json(),
    }
    write_text(path, json.dumps(entry, sort_keys=True))
