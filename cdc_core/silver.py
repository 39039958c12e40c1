"""Stage 4: bronze -> newest change per key -> one guarded MERGE into each typed silver mirror.

A batch is every bronze row of a table after the mirror's watermark, in (commit LSN, position)
order. A TRUNCATE empties the mirror and only what follows it counts. Unchanged TOASTed values
are taken from the key's earlier changes in the batch, else kept from the stored row. The MERGE
updates a row only when the change is newer by that order (the one guard, `NEWER`), so applying
a batch twice changes nothing; it also runs under Delta's txnAppId/txnVersion and records the
watermark in its own commit. Tables without a primary key are multisets: `_cdc_count` counts
identical rows.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core import dead_letters, delta_log, faults
from cdc_core.envelope import MESSAGES_TABLE
from cdc_core.errors import TerminalError
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.lake_state import committing, read_watermark, table_version
from cdc_core.lsn import Lsn
from cdc_core.name_patterns import matches_any
from cdc_core.pgtypes import DEFAULT_MODES, TypeModes
from cdc_core.reset_marker import RESET_PREFIX
from cdc_core.silver_batch import (
    JSON_OPTIONS,
    REFUSED,
    after_position,
    keyed_source,
    multiset_refusals,
    multiset_source,
    parsed,
    refusal,
    typed,
    typed_with,
    unsent_columns,
    view_column,
    visible,
)
from cdc_core.silver_shape import (
    SchemaChangeError,
    SilverColumn,
    TableShape,
    modes_used,
    table_shape,
)
from cdc_core.silver_table import ensure_silver, quoted, register, sql_name
from cdc_core.spark import Spark, built_once, each_in_session, session_of
from cdc_core.stager import StagedFile
from cdc_core.state import (
    caught_up_file,
    mirror_owner,
    pruned_positions,
    read_json,
    schema_history,
    write_json,
)

log = logging.getLogger(__name__)

WATERMARK = "silver_applied"
SINCE = "shapes_since"  # with the watermark: where the mirror last started over (table_shape)
SOFT_DELETE = "soft_delete"  # with the watermark: whether the mirror was written soft deleting
MODES = "modes"  # with the watermark: the representation options its values were typed under
MERGE_APP = "cdc-silver"
TRUNCATE_APP = "cdc-silver-truncate"
NEWER = "(s._cdc_lsn > t._cdc_lsn OR (s._cdc_lsn = t._cdc_lsn AND s._cdc_seq > t._cdc_seq))"


@dataclass(frozen=True)
class SilverSettings:
    """How mirrors are typed and kept."""

    modes: TypeModes = DEFAULT_MODES
    soft_delete: bool = False
    register: bool = False
    database: str = "cdc"
    propagate_columns: tuple[str, ...] = ()  # anchored, case-insensitive: schema.table.column
    propagate_types: tuple[str, ...] = ()  # anchored, case-insensitive: schema.table.<type name>
    threads: int = 1  # mirrors merged at once
    slot: str | None = None  # the pipeline's: reset markers for another are not applied
    failure_handling: dead_letters.FailureHandling = "fail"  # a change silver cannot apply
    pipeline: str | None = None  # whose mirrors: a catalog entry of another's is not taken

    def propagates(self, table: str, column: SilverColumn) -> bool:
        """Whether the column's silver field metadata carries its source type."""
        name = f"{table}.{column.name}"
        kind = f"{table}.{'_' if column.pg.array else ''}{column.pg.name}"
        return matches_any(self.propagate_columns, name) or matches_any(self.propagate_types, kind)


@dataclass(frozen=True)
class TableResult:
    """What one table's silver step did."""

    table: str
    changes: int
    error: str | None = None
    dead_letters: int = 0  # changes set aside (warn, skip), not applied


@dataclass
class CaughtUp:
    """Per mirror, the bronze and silver versions at which the mirror held every bronze row of
    its table. A later batch skips a table when the mirror is still at that version and no
    bronze commit since wrote the table's partition (read from the log: milliseconds, where
    finding the table's pending rows is a Spark job). Only for batches without snapshot work:
    reads held back behind the stream frontier are pending rows that no new bronze commit
    announces. Kept in `_state/silver_caught.json` between runs, so a scheduled `--once` run
    skips what nothing came for as `--continuous` batches do; an entry that no longer matches
    (a run died between the MERGE and the save, the mirror was rewritten) only costs the skip.
    The versions hold under the `soft_delete` they were reached with: switched, every mirror is
    looked at again (switched off, the rows it left marked deleted go, `_purge_tombstones`)."""

    versions: dict[str, tuple[int, int]] = field(default_factory=dict)
    soft_delete: bool | None = None  # None: not known (a file written before it was recorded)

    @classmethod
    def load(cls, lake: Lake) -> CaughtUp:
        data = read_json(caught_up_file(lake))
        tables = data.get("tables") if isinstance(data, dict) else None
        if not isinstance(tables, dict):
            return cls()
        mode = data.get(SOFT_DELETE)
        return cls({
            str(t): (int(v[0]), int(v[1])) for t, v in tables.items()
            if isinstance(v, list) and len(v) == 2
        }, mode if isinstance(mode, bool) else None)  # fmt: skip

    def save(self, lake: Lake) -> None:
        tables = {t: list(v) for t, v in sorted(self.versions.items())}
        write_json(caught_up_file(lake), {SOFT_DELETE: self.soft_delete, "tables": tables})

    def untouched(self, lake: Lake, table: TableName, bronze: int, silver: int) -> bool:
        known = self.versions.get(table.qualified)
        if known is None or known[1] != silver or known[0] > bronze:
            return False
        written = delta_log.partitions_written(
            lake.place(lake.bronze), known[0], bronze, "source_table"
        )
        return written is not None and table.qualified not in written


def apply_silver(
    spark: Spark, lake: Lake, tables: list[TableName], settings: SilverSettings,
    *, frontier: int | None = None, caught: CaughtUp | None = None,
) -> list[TableResult]:  # fmt: skip
    """Apply every table's pending bronze rows; a table that cannot follow its source stops
    alone (its error is in the result) while the others go on. Snapshot reads placed after
    `frontier` (the stream has not reached them yet) wait. With `caught`, tables that bronze
    got nothing new for since the last batch are skipped (without a Spark session, for a local
    lake: `spark` may be one still starting)."""
    results: dict[str, TableResult] = {}
    todo = []
    if caught is not None and caught.soft_delete != settings.soft_delete:
        caught.versions.clear()  # reached under the other setting: each mirror is looked at
        caught.soft_delete = settings.soft_delete
    bronze = table_version(spark, lake.bronze) if caught is not None else -1
    for table in tables:
        silver = table_version(spark, lake.silver(table)) if caught is not None else -1
        if caught is not None and caught.untouched(lake, table, bronze, silver):
            caught.versions[table.qualified] = (bronze, silver)  # keeps the log read short
            results[table.qualified] = TableResult(table.qualified, 0)
        else:
            todo.append(table)

    def one(session: SparkSession, table: TableName) -> TableResult:
        faults.point("silver.before_merge")
        try:
            result = apply_table(session, lake, table, settings, frontier=frontier)
        except SchemaChangeError as e:
            result = TableResult(table.qualified, 0, str(e))
        except Exception as e:  # a key or value silver refuses (fail), found on an executor
            refused = refusal(e)
            if refused is None:
                raise
            result = TableResult(table.qualified, 0, refused)
        faults.point("silver.after_merge")
        return result

    if todo:
        for table, result in zip(todo, each_in_session(session_of(spark), one, todo,
                                                       settings.threads), strict=True):  # fmt: skip
            results[table.qualified] = result
            if caught is not None:
                caught.versions.pop(table.qualified, None)
                if result.error is None:
                    after = table_version(spark, lake.silver(table))
                    caught.versions[table.qualified] = (bronze, after)
    return [results[t.qualified] for t in tables]


def apply_table(
    spark: SparkSession, lake: Lake, table: TableName, settings: SilverSettings,
    *, frontier: int | None = None,
) -> TableResult:  # fmt: skip
    history = schema_history(lake, table.qualified)
    if not history:
        return TableResult(table.qualified, 0)  # nothing captured for it yet
    path = lake.silver(table)
    mark = read_watermark(spark, path, WATERMARK)
    after = _position(mark[WATERMARK]) if mark else (-1, -1)
    since = shapes_since(mark)
    rows = _pending(spark, lake, table, after, frontier=frontier, slot=settings.slot)
    rows = _past_old_keys(table, rows, history, after)
    ready = _typed_pending(rows, history, since, settings)
    summary = ready.summary if ready is not None else _summary(rows)
    if summary is not None and summary[2] is not None:  # the mirror starts over at a TRUNCATE:
        since = max(since or 0, summary[2][2])  # shapes recorded before it no longer count
    if mark is None:  # a new mirror, or one dropped: built from what bronze still holds
        _refuse_partial_rebuild(lake, table, summary)
    shape = table_shape(history, settings.modes, settings.propagates, since=since)
    if ready is not None and ready.shape != shape:
        ready = None  # typed by the shapes the TRUNCATE set aside: typed again, by this one
    if mark is not None and (summary is None or summary[2] is None):  # not starting over
        _refuse_other_modes(table, shape, settings.modes, mark)
    starting_over = summary is not None and summary[2] is not None
    replace = ensure_silver(spark, path, shape, starting_over=starting_over)
    if settings.register:
        register(spark, path, shape, settings.database, pipeline=settings.pipeline,
                 owner=functools.partial(mirror_owner, lake))  # fmt: skip
    _purge_tombstones(spark, path, table, settings, mark)
    if summary is None:
        return TableResult(table.qualified, 0)
    changes, end, truncated, unsent, reads = summary
    marks: dict[str, object] = {SOFT_DELETE: settings.soft_delete}
    marks |= {MODES: modes_used(shape, settings.modes)}
    marks |= {SINCE: since} if since is not None else {}
    batch = rows.where(~after_position(*end))
    typed_rows = ready.rows if ready is not None else None
    if truncated is not None:  # only what follows the last TRUNCATE counts
        position = truncated[:2]
        _empty(spark, path, settings, txn=once(TRUNCATE_APP, position, after),
               watermark=position, marks=marks, schema=shape if replace else None)  # fmt: skip
        batch = batch.where((F.col("op") != "t") & after_position(*position))
        if typed_rows is not None:
            typed_rows = typed_rows.where(
                (F.col("_cdc_op") != "t")
                & after_position(*position, lsn_column="_cdc_lsn", seq_column="_cdc_seq")
            )
    if reads and not shape.key:  # a snapshot of a table without a key replaces its content
        _empty(spark, path, settings, txn=once(TRUNCATE_APP, end, after), watermark=after,
               marks=marks)  # fmt: skip
        if truncated is None:
            batch = _with_unseen_applied(spark, lake, table, batch, after, slot=settings.slot)
    typed_rows, set_aside = _applicable(
        spark, lake, table, batch, shape, typed_rows=typed_rows,
        refused=ready.refused if ready is not None else 0, settings=settings,
    )  # fmt: skip
    only_reads = shape.key and reads == changes and truncated is None
    if not (only_reads and _append_reads(spark, lake, path, typed_rows, shape, end=end,
                                         after=after, settings=settings, marks=marks)):  # fmt: skip
        _merge(spark, path, shape, typed_rows, end=end, after=after, settings=settings,
               unsent=unsent, reads=reads > 0, marks=marks)  # fmt: skip
    return TableResult(table.qualified, changes, dead_letters=set_aside)


def _past_old_keys(
    table: TableName, rows: DataFrame, history: list[tuple[int, RelationDescriptor]],
    after: tuple[int, int],
) -> DataFrame:  # fmt: skip
    """The pending `rows`, after the table's primary key changed under them: from the last
    TRUNCATE on (the mirror starts over there, and what came before is never applied, nor
    typed). The mirror stops when a change of them was recorded under the old key: a delete
    (or the old half of a key change) carries only the old key's values, which silver,
    matching every change of the batch by the newest key, cannot match. Looked at only when
    the shapes the pending changes may have been recorded under differ in key, so a batch of
    a table whose key never changed reads nothing more."""
    live = [i for i, (lsn, _) in enumerate(history) if lsn > after[0]]
    start = max(0, live[0] - 1) if live else len(history) - 1
    keys = list(dict.fromkeys(d.primary_key for _, d in history[start:] if d.primary_key))
    newest = history[-1][1].primary_key
    if len(keys) < 2 or not newest:  # a key lost: `silver_table.key_changed` says so
        return rows
    truncated = rows.where(F.col("op") == "t").agg(F.max(F.struct("commit_lsn", "seq"))).first()
    if truncated is not None and truncated[0] is not None:  # from it on: at or after it
        lsn, seq = truncated[0]
        rows = rows.where(after_position(lsn, seq - 1))
    struct = T.StructType([T.StructField(k, T.StringType()) for k in newest])
    key = F.from_json("before", struct, JSON_OPTIONS)
    missing = functools.reduce(lambda a, b: a | b, (key[k].isNull() for k in newest))
    if rows.where((F.col("op") == "d") & missing).limit(1).count() == 0:
        return rows
    old = [k for k in keys if k != newest][-1]
    raise SchemaChangeError(
        f"table {table.qualified}: its primary key changed from ({', '.join(old)}) to "
        f"({', '.join(newest)}) while changes recorded under the old one were still to be "
        "applied: a delete or a key change carries only the old key's values, and the mirror "
        f"matches rows by {', '.join(newest)} now. The mirror stops here; other tables go on. "
        "To move on, drop the silver table and take a new snapshot of it (`cdc snapshot "
        f"--table {table.qualified}`), which rebuilds the mirror from that snapshot on. To "
        "change a primary key without a new snapshot, stop writes to the table, let a run "
        "apply every change made before, change the key, then resume writes"
    )


def _with_unseen_applied(
    spark: SparkSession, lake: Lake, table: TableName, batch: DataFrame,
    after: tuple[int, int], *, slot: str | None,
) -> DataFrame:  # fmt: skip
    """A batch that replaces a table's content by a snapshot read (it has no key), with the
    changes before the batch (up to `after`) that the newest read did not see: committed, but
    still running for the read's snapshot (`cdc_core.snapshot_window`). An earlier batch applied
    them and emptying the mirror took them out: the multiset source puts them on top of the
    read, with the batch's own changes the read did not see. None are before the read's
    `unseen_from`, which is usually past `after`: then bronze is not read."""
    newest = (
        batch.where(F.col("op") == "r").orderBy(F.col("commit_lsn").desc())
        .select("read_view").first()
    )  # fmt: skip
    view = newest["read_view"] if newest is not None else None
    if view is None or view["unseen_from"] is None or view["unseen_from"] > after[0]:
        return batch
    bronze = spark.read.format("delta").load(lake.bronze)
    of_table, op = _of_table(table.qualified, slot)
    unseen = bronze.where(
        of_table & F.col("op").isin("c", "u", "d") & ~after_position(*after)
        & (F.col("commit_lsn") >= view["unseen_from"]) & F.col("source.txId").isNotNull()
        & ~visible(F.col("source.txId"), view_column(view.asDict()))
    ).withColumn("op", op)  # fmt: skip
    return unseen.unionByName(batch)


def _applicable(
    spark: SparkSession, lake: Lake, table: TableName, batch: DataFrame, shape: TableShape, *,
    typed_rows: DataFrame | None, refused: int, settings: SilverSettings,
) -> tuple[DataFrame, int]:  # fmt: skip
    """The batch's changes silver applies (a keyed table's typed, `typed_rows` when already
    typed with `refused` refusals; a multiset's parsed) and how many it set aside (warn, skip),
    those recorded in the dead-letter table before the watermark passes them."""
    refusals = settings.failure_handling != "fail"
    if not shape.key:
        changes = parsed(batch, shape)
        if not refusals:
            return changes, 0
        found = multiset_refusals(changes, shape, settings.modes)
        if not found.count:
            return found.kept, 0
        return found.kept, _record(spark, lake, table, found.refused, settings)
    if typed_rows is None:
        typing = typed_with(parsed(batch, shape), shape, settings.modes, [], refusals=refusals)
        typed_rows, refused = typing.rows, typing.refused
    if not refusals:
        return typed_rows, 0
    return _set_aside(spark, lake, table, typed_rows, refused=refused, settings=settings)


def _set_aside(
    spark: SparkSession, lake: Lake, table: TableName, typed_rows: DataFrame, *, refused: int,
    settings: SilverSettings,
) -> tuple[DataFrame, int]:  # fmt: skip
    """The typed changes without those the typing refused (`refused` of them, maybe some
    before a TRUNCATE), which go to the dead-letter table first (`_record`); and how many the
    batch set aside."""
    if not refused:
        return typed_rows.drop(REFUSED), 0
    count = _record(spark, lake, table, typed_rows, settings)
    return typed_rows.where(F.col(REFUSED).isNull()).drop(REFUSED), count


def _record(
    spark: SparkSession, lake: Lake, table: TableName, typed_rows: DataFrame,
    settings: SilverSettings,
) -> int:  # fmt: skip
    """Write the refused typed changes to the dead-letter table (those it holds already are
    not added again) and log them; how many the batch set aside."""
    rows = dead_letters.dead_letters(typed_rows, table.qualified).localCheckpoint()
    inserted = dead_letters.record(spark, lake, rows, table.qualified)
    faults.point("silver.dead_letters")
    dead_letters.report(table.qualified, rows, settings.failure_handling, inserted)
    return rows.count()


def _refuse_other_modes(
    table: TableName, shape: TableShape, modes: TypeModes, mark: dict[str, object]
) -> None:
    """A mirror whose values were typed under other representation options than `modes` (a
    time of day in milliseconds, now nanoseconds; a numeric as decimal, now text) would hold
    values of both side by side, often in one Spark type and unnoticed: it stops instead, until
    the option is set back or the mirror is rebuilt. Options none of its columns use do not
    count; a mirror written before the options were recorded is not checked."""
    recorded = mark.get(MODES)
    if not isinstance(recorded, dict):
        return
    now = modes_used(shape, modes)
    changed = [key for key in now if key in recorded and recorded[key] != now[key]]
    if not changed:
        return
    t = table.qualified
    options = ", ".join(f"silver.{key}: {recorded[key]} then, {now[key]} now" for key in changed)
    raise SchemaChangeError(
        f"table {t}: its silver mirror was typed under other options than the pipeline's now "
        f"({options}), and would hold values of both side by side. The mirror stops here; "
        "other tables go on. To move on, set the option back, or drop the silver table and take "
        f"a new snapshot of it (`cdc snapshot --table {t}`), which rebuilds the mirror under the "
        "new option"
    )


def _refuse_partial_rebuild(lake: Lake, table: TableName, summary: Summary | None) -> None:
    """A mirror built from bronze after bronze retention took some of the table's rows
    (`maintenance.note_pruned`) would be missing them, unless the batch starts over after them
    (a TRUNCATE, or the reset marker a snapshot of a dropped mirror writes): it stops instead."""
    pruned = pruned_positions(lake).get(table.qualified)
    if pruned is None:
        return
    truncated = summary[2] if summary is not None else None
    if truncated is not None and truncated[:2] > pruned:
        return
    t = table.qualified
    raise SchemaChangeError(
        f"table {t} has no silver mirror (or one without a merge), and bronze retention "
        f"(maintenance.bronze_retention_days) has deleted its changes up to {Lsn(pruned[0])}, "
        "so a mirror built from bronze would be missing rows. The mirror stops here; other "
        "tables go on. To rebuild it, drop what is left of the silver table and take a new "
        f"snapshot of it (`cdc snapshot --table {t}`), which rebuilds the mirror from that "
        "snapshot on"
    )


@dataclass(frozen=True)
class _Typed:
    """A keyed table's pending rows typed by `shape`, and their summary (`_summary`)."""

    shape: TableShape
    rows: DataFrame
    summary: Summary | None
    refused: int  # changes silver cannot apply (warn, skip): `REFUSED` says why


def _typed_pending(
    rows: DataFrame,
    history: list[tuple[int, RelationDescriptor]],
    since: int | None,
    settings: SilverSettings,
) -> _Typed | None:
    """The pending rows of a keyed table, typed by the shapes recorded since the mirror last
    started over, with their summary from the same materialized rows: one pass over bronze,
    where summarising first costs a pass of its own. None (summarise bronze first) when those
    shapes do not agree (a TRUNCATE in the batch may set the older ones aside) or the table
    has no key (its changes are counted before they are typed)."""
    try:
        shape = table_shape(history, settings.modes, settings.propagates, since=since)
    except SchemaChangeError:
        return None
    if not shape.key:
        return None
    found = _summary_aggregates(unchanged="_unchanged", staged_file="_staged_file")
    refusals = settings.failure_handling != "fail"
    typing = typed_with(parsed(rows, shape), shape, settings.modes, found, refusals=refusals)
    return _Typed(shape, typing.rows, _read_summary(typing.found), typing.refused)


def shapes_since(mark: dict[str, object] | None) -> int | None:
    """Where the mirror last started over (the start of the staged file that held its last
    TRUNCATE or reset marker), as its newest watermark records it."""
    value = mark.get(SINCE) if mark else None
    return int(value) if isinstance(value, int) else None


def _position(value: object) -> tuple[int, int]:
    """A recorded (commit LSN, position) pair."""
    if not isinstance(value, list) or len(value) != 2:
        raise TerminalError(f"a silver watermark reads {value!r}, not [commit LSN, position]")
    return int(value[0]), int(value[1])


Summary = tuple[int, tuple[int, int], tuple[int, int, int] | None, list[str], int]


def _summary(rows: DataFrame) -> Summary | None:
    """One pass over the pending bronze rows: how many, the last position, the last TRUNCATE's
    (and the first LSN of the staged file that held it), which columns some change did not
    carry (unchanged TOAST), and how many snapshot reads."""
    return _read_summary(rows.agg(*_summary_aggregates("unchanged", "staged_file")).first())


@built_once
def _summary_aggregates(unchanged: str, staged_file: str) -> tuple[Column, ...]:
    """`_summary`'s aggregates over rows with `op`, `commit_lsn`, `seq` and these columns."""
    pos = F.struct("commit_lsn", "seq")
    truncate = F.struct("commit_lsn", "seq", F.col(staged_file).alias("staged_file"))
    return (
        F.count(F.lit(1)).alias("n"),
        F.max(pos).alias("end"),
        F.max(F.when(F.col("op") == "t", truncate)).alias("truncated"),
        F.array_distinct(
            F.flatten(F.collect_set(F.when(F.size(unchanged) > 0, F.col(unchanged))))
        ).alias("unsent"),  # each non-empty list once: a million reads collect nothing
        F.count(F.when(F.col("op") == "r", 1)).alias("reads"),
    )


def _read_summary(found: Row | None) -> Summary | None:
    if found is None or not found["n"]:
        return None
    end = (int(found["end"]["commit_lsn"]), int(found["end"]["seq"]))
    t = found["truncated"]
    truncated = (int(t["commit_lsn"]), int(t["seq"]), _file_start(t["staged_file"])) if t else None
    return int(found["n"]), end, truncated, sorted(found["unsent"]), int(found["reads"])


def _file_start(staged_file: object) -> int:
    """The first LSN of a staged change file, by its id; 0 (every shape counts) otherwise."""
    try:
        return StagedFile.parse(f"{staged_file}{StagedFile.SUFFIX}").start.value
    except ValueError:
        return 0


def _pending(
    spark: SparkSession, lake: Lake, table: TableName, after: tuple[int, ...],
    *, frontier: int | None, slot: str | None,
) -> DataFrame:  # fmt: skip
    bronze = spark.read.format("delta").load(lake.bronze)
    of_table, op = _of_table(table.qualified, slot)
    rows = bronze.where(of_table & after_position(after[0], after[1])).withColumn("op", op)
    if frontier is not None:  # stream changes are all before it; reads after it wait
        rows = rows.where((F.col("op") != "r") | (F.col("commit_lsn") <= frontier))
    return rows


@built_once
def _of_table(table: str, slot: str | None) -> tuple[Column, Column]:
    """Bronze rows that are `table`'s changes, or reset markers of it for the pipeline reading
    `slot`; and their `op`, a reset marker's a TRUNCATE's."""
    reset = (F.col("op") == "m") & reset_marker(table, slot)
    return (
        F.col("source_table").isin(table, MESSAGES_TABLE)
        & ((F.col("source_table") == table) & F.col("op").isin("c", "u", "d", "r", "t") | reset),
        F.when(reset, F.lit("t")).otherwise(F.col("op")),
    )


@built_once
def reset_marker(table: str, slot: str | None) -> Column:
    """Bronze rows that are reset markers (`cdc_core.reset_marker`) of `table` for the
    pipeline reading `slot` (None: for any); one in the older form (the bare table name)
    is for every pipeline. JSON functions return NULL on the older form."""
    content = F.col("message.content").cast("string")
    named, slot_named = (F.get_json_object(content, f"$.{k}") for k in ("table", "slot"))
    ours = F.lit(True) if slot is None else slot_named == F.lit(slot)
    return (
        (F.col("source_table") == MESSAGES_TABLE)
        & (F.col("message.prefix") == F.lit(RESET_PREFIX))
        & F.when(named.isNull(), content == F.lit(table)).otherwise((named == F.lit(table)) & ours)
    )


def _purge_tombstones(
    spark: SparkSession, path: str, table: TableName, settings: SilverSettings,
    mark: dict[str, object] | None,
) -> None:  # fmt: skip
    """Without soft_delete, remove the rows an earlier soft_delete left marked `_cdc_deleted`:
    users of such a mirror do not filter them out. Only when the mirror's newest watermark says
    it was written soft deleting, or does not say (written before that was recorded): the
    commit restates the watermark with soft_delete off, so later batches skip this. A run that
    dies before that commit purges again; nothing is lost, the watermark does not move."""
    if settings.soft_delete or (mark is not None and mark.get(SOFT_DELETE) is False):
        return
    target = DeltaTable.forPath(spark, path)
    before = table_version(spark, path)
    with committing(spark, (mark or {}) | {SOFT_DELETE: False}):
        target.delete(F.col("_cdc_deleted"))
        after = table_version(spark, path)
        if after == before and mark is not None:  # none there: record the setting alone
            watermark = _position(mark[WATERMARK])
            spark.sql(f"ALTER TABLE {sql_name(path)} SET TBLPROPERTIES ('cdc.watermark' = "
                      f"'{watermark[0]}/{watermark[1]}')")  # fmt: skip
    if after == before:
        return
    metrics = target.history(1).select("operationMetrics").first()
    removed = (metrics[0] or {}).get("numDeletedRows", "?") if metrics else "?"
    log.warning(
        "%s: %s rows marked _cdc_deleted removed from its mirror %s: silver.soft_delete is off "
        "now, and users of a mirror without it read every row", table.qualified, removed, path,
    )  # fmt: skip


def once(app: str, at: tuple[int, int], mark: tuple[int, int]) -> tuple[str, int]:
    """The txnAppId and txnVersion that make a write of a mirror at position `at` happen once,
    its watermark being `mark`: the commit LSN, under `app`. A write at the commit LSN the
    watermark has reached would be skipped under it as done (a snapshot read sits right before a
    transaction that commits at the read's very place, and may land a batch earlier): it goes
    by its place within that commit instead, under an id of that LSN's own."""
    if at[0] > mark[0]:
        return app, at[0]
    return f"{app}@{at[0]}", at[1] + 2  # a read's place is -1


def _empty(
    spark: SparkSession, path: str, settings: SilverSettings, *, txn: tuple[str, int],
    watermark: tuple[int, int], marks: dict[str, object], schema: TableShape | None = None,
) -> None:  # fmt: skip
    """Empty the mirror (or mark every row deleted, a multiset's counted to 0), once per `txn`
    (`once`); the commit records `watermark`, where a run that dies right after resumes (and
    `marks`). With `schema`, a shape the mirror cannot take in place (`ensure_silver`), the same
    commit replaces the table by an empty one of that shape: rows marked deleted go too, their
    columns cannot hold the new types (bronze keeps their history)."""
    target = DeltaTable.forPath(spark, path)
    record = {WATERMARK: list(watermark)} | marks
    with committing(spark, record, app_id=txn[0], version=txn[1]):
        if schema is not None:
            kept = target.toDF().count() if settings.soft_delete else 0
            empty = spark.createDataFrame([], schema.spark_schema())
            empty.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(
                path
            )
            log.warning(
                "%s: its silver mirror starts over with a schema it cannot take in place (%s); "
                "the mirror is replaced by an empty one of the new schema%s", schema.qualified,
                ", ".join(f"{c.name} {c.type_name}" for c in schema.columns),
                f", and its {kept} rows marked _cdc_deleted go with the old one (bronze keeps "
                "their changes)" if kept else "",
            )  # fmt: skip
        elif settings.soft_delete:
            gone: dict[str, str | Column] = {"_cdc_deleted": F.lit(True), "_cdc_op": F.lit("t")}
            if "_cdc_count" in target.toDF().columns:  # a multiset's rows come back counted anew
                gone["_cdc_count"] = F.lit(0)
            target.update(set=gone)
        else:
            target.delete()


def _merge(
    spark: SparkSession, path: str, shape: TableShape, batch: DataFrame, *,
    end: tuple[int, int], after: tuple[int, int], settings: SilverSettings, unsent: list[str],
    reads: bool, marks: dict[str, object],
) -> None:  # fmt: skip
    """The batch's MERGE, exactly once (txnAppId/txnVersion), recording the watermark (and
    `marks`). `batch`: a keyed table's typed changes, a multiset's parsed changes."""
    before = table_version(spark, path)
    record = {WATERMARK: list(end)} | marks
    app, version = once(MERGE_APP, end, after)
    with committing(spark, record, app_id=app, version=version):
        if shape.key:
            merge_typed(spark, path, shape, batch, settings, unsent=unsent, reads=reads)
        else:
            merge_multiset(spark, path, shape, batch, settings, reads=reads)
        if table_version(spark, path) == before:  # nothing to change: record the watermark alone
            spark.sql(f"ALTER TABLE {sql_name(path)} SET TBLPROPERTIES ('cdc.watermark' = "
                      f"'{end[0]}/{end[1]}')")  # fmt: skip


def _append_reads(
    spark: SparkSession, lake: Lake, path: str, changes: DataFrame, shape: TableShape, *,
    end: tuple[int, int], after: tuple[int, int], settings: SilverSettings,
    marks: dict[str, object],
) -> bool:  # fmt: skip
    """A batch of snapshot reads alone (typed `changes`), into a mirror without a row, is
    appended: the rows the MERGE would insert, without its join and target scan (an initial
    snapshot's whole table lands this way). Exactly once like the MERGE (the same
    txnAppId/txnVersion and watermark). False, with nothing written, when the mirror has rows
    or a typed key repeats (a row moved between two groups' reads while nothing streamed): the
    MERGE decides then."""
    state = delta_log.read_table(lake.place(path))
    if state is None or state.files:
        return False
    repeated = changes.groupBy(*[F.col(quoted(k)) for k in shape.key]).count().where("count > 1")
    if repeated.limit(1).count():
        return False
    rows = changes.withColumns({
        "_cdc_deleted": F.lit(False), "_cdc_unavailable": F.col("_unchanged"),
    })  # fmt: skip
    # The mirror's own types (widened ones too); columns it has beyond the shape (dropped at
    # the source) stay NULL, as the MERGE leaves them.
    target = DeltaTable.forPath(spark, path).toDF().schema
    present = set(rows.columns)
    typed_as_stored = [
        F.col(quoted(f.name)).cast(f.dataType).alias(f.name)
        for f in target.fields
        if f.name in present
    ]
    rows = rows.select(*typed_as_stored)
    record = {WATERMARK: list(end)} | marks
    app, version = once(MERGE_APP, end, after)
    with committing(spark, record, app_id=app, version=version):
        rows.write.format("delta").mode("append").save(path)
    log.info("%s: snapshot rows appended to its empty mirror", shape.qualified)
    return True


def merge_changes(
    spark: SparkSession, path: str, shape: TableShape, batch: DataFrame, settings: SilverSettings,
    *, unsent: list[str] | None = None, reads: bool = True,
) -> None:  # fmt: skip
    """MERGE bronze rows of one table into its mirror behind the order guard. Applying the same
    rows again changes nothing (multiset tables rely on the caller's exactly-once instead).
    `unsent`: columns some change did not carry (None: find out); `reads`: whether the batch
    may hold snapshot reads."""
    values = parsed(batch, shape)
    if shape.key:
        changes = typed(values, shape, settings.modes)  # materialized: typed once
        merge_typed(spark, path, shape, changes, settings, unsent=unsent, reads=reads)
    else:
        merge_multiset(spark, path, shape, values, settings, reads=reads)


def merge_multiset(
    spark: SparkSession, path: str, shape: TableShape, values: DataFrame,
    settings: SilverSettings, *, reads: bool = True,
) -> None:  # fmt: skip
    """`merge_changes` for the changes of a table without a key, already parsed
    (`silver_batch.parsed`): typed after they are counted per row. The mirror was emptied for
    a batch with reads (`apply_table`): the newest read replaces it, and only the changes that
    read did not see follow; an older read in the batch (another job's) is left out, since it
    would add each of its rows once more."""
    target = DeltaTable.forPath(spark, path)
    view = None
    if reads:
        newest = (
            values.where(F.col("op") == "r")
            .orderBy(F.col("commit_lsn").desc())
            .select("commit_lsn", "_read_view")
            .first()
        )  # a read's rows share its high watermark and its view
        if newest is not None:
            values = values.where((F.col("op") != "r") | (F.col("commit_lsn") == newest[0]))
            view = newest["_read_view"].asDict() if newest["_read_view"] else None
    source = typed(multiset_source(values, shape, view), shape, settings.modes)
    _multiset_merge(target, source, shape, settings).execute()


def merge_typed(
    spark: SparkSession, path: str, shape: TableShape, changes: DataFrame,
    settings: SilverSettings, *, unsent: list[str] | None = None, reads: bool = True,
) -> None:  # fmt: skip
    """`merge_changes` for a keyed table's changes already typed (`silver_batch.typed`)."""
    target = DeltaTable.forPath(spark, path)
    unsent = unsent_columns(changes) if unsent is None else unsent
    source = keyed_source(changes, shape, target.toDF(), unsent, reads=reads)
    _keyed_merge(target, source, shape, settings, unsent=unsent).execute()


def sweep(
    spark: SparkSession, path: str, before: tuple[int, int], settings: SilverSettings
) -> None:
    """After a full snapshot, remove rows whose last change is older than its first read: the
    snapshot did not find them, so the source no longer has them. Marked deleted under
    soft_delete, in a commit that restates the mirror's watermark with soft_delete on, so that
    switching it off removes them (`_purge_tombstones`)."""
    target = DeltaTable.forPath(spark, path)
    older = F.col("_cdc_lsn") < before[0]
    older = older | ((F.col("_cdc_lsn") == before[0]) & (F.col("_cdc_seq") < before[1]))
    if settings.soft_delete:
        mark = read_watermark(spark, path, WATERMARK) or {}
        with committing(spark, mark | {SOFT_DELETE: True}):
            target.update(
                older & ~F.col("_cdc_deleted"),
                {"_cdc_deleted": F.lit(True), "_cdc_op": F.lit("d")},
            )
    else:
        target.delete(older)


def _lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cdc_set(deleted: str) -> dict[str, str | Column]:
    return {
        "_cdc_lsn": "s._cdc_lsn", "_cdc_seq": "s._cdc_seq", "_cdc_op": "s._cdc_op",
        "_cdc_commit_ts": "s._cdc_commit_ts", "_cdc_deleted": deleted,
    }  # fmt: skip


def _keyed_merge(
    target: DeltaTable, source: DataFrame, shape: TableShape, settings: SilverSettings, *,
    unsent: Collection[str],
) -> DeltaMergeBuilder:  # fmt: skip
    """`unsent`: the columns some change of the batch did not carry. Only those can keep the
    stored value; every other column is the change's own. (The MERGE plans an expression per
    column: a CASE for each of 500 cost a one-change batch 18% of its time.)"""
    unsent = frozenset(unsent)
    on = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in shape.key)
    update: dict[str, str | Column] = {
        quoted(c.name): _unless_unchanged(c.name, unsent, target_side=True) for c in shape.columns
    }
    update |= _cdc_set("false")
    update["_cdc_raw"] = ("map_concat(map_filter(coalesce(t._cdc_raw, map()), (k, v) -> "
                          "array_contains(s._unchanged, k)), s._cdc_raw)")  # fmt: skip
    update["_cdc_unavailable"] = ("array_union(filter(t._cdc_unavailable, c -> "
                                  "array_contains(s._unchanged, c)), s._unknown)")  # fmt: skip
    insert: dict[str, str | Column] = {
        quoted(c.name): _unless_unchanged(c.name, unsent, target_side=False) for c in shape.columns
    }
    insert |= _cdc_set("false") | {
        "_cdc_raw": "s._cdc_raw",
        "_cdc_unavailable": "array_union(s._unchanged, s._unknown)",
    }
    builder = target.alias("t").merge(source.alias("s"), on)
    deleted = f"s._cdc_op = 'd' AND {NEWER}"
    if settings.soft_delete:
        builder = builder.whenMatchedUpdate(deleted, _cdc_set("true"))
    else:
        builder = builder.whenMatchedDelete(deleted)
    builder = builder.whenMatchedUpdate(f"s._cdc_op <> 'd' AND {NEWER}", update)
    return builder.whenNotMatchedInsert("s._cdc_op <> 'd'", insert)


def _unless_unchanged(name: str, unsent: Collection[str], *, target_side: bool) -> str:
    """A column's new value, unless the change did not carry it (unchanged TOAST)."""
    if name not in unsent:  # every change of the batch carried it
        return f"s.{quoted(name)}"
    kept = f"t.{quoted(name)}" if target_side else "NULL"
    missing = f"array_contains(s._unchanged, {_lit(name)})"
    return f"CASE WHEN {missing} THEN {kept} ELSE s.{quoted(name)} END"


def _multiset_merge(
    target: DeltaTable, source: DataFrame, shape: TableShape, settings: SilverSettings
) -> DeltaMergeBuilder:
    count = "t._cdc_count + s._cdc_delta"
    values: dict[str, str | Column] = {quoted(c.name): f"s.{quoted(c.name)}" for c in shape.columns}
    values |= _cdc_set("false") | {"_cdc_raw": "s._cdc_raw", "_cdc_unavailable": "array()"}
    values |= {"_cdc_row_hash": "s._cdc_row_hash", "_cdc_count": "s._cdc_delta"}
    builder = target.alias("t").merge(source.alias("s"), "t._cdc_row_hash = s._cdc_row_hash")
    if settings.soft_delete:
        gone = _cdc_set("true") | {"_cdc_count": "0"}
        builder = builder.whenMatchedUpdate(f"{count} <= 0", gone)
    else:
        builder = builder.whenMatchedDelete(f"{count} <= 0")
    builder = builder.whenMatchedUpdate(set=_cdc_set("false") | {"_cdc_count": count})
    return builder.whenNotMatchedInsert("s._cdc_delta > 0", values)
