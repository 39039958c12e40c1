"""Silver's pure transforms: bronze rows -> typed changes -> one change per key (or row delta).

`parsed` reads the JSON text of each change, `typed` converts it per the type mapping (a Spark
cast where that is exact, `silver_fast`, else Python on executors, `mapInArrow`), `keyed_source`
resolves unchanged TOASTed values and keeps the newest change per key, `multiset_source` turns
the changes of a table without a key into counts.
Every function is DataFrame -> DataFrame; only the caller does I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.pgtypes import TypeModes, Unrepresentable, converter
from cdc_core.silver_fast import fast_value
from cdc_core.silver_shape import TableShape, arrow_type, describe, spark_type
from cdc_core.silver_table import quoted
from cdc_core.spark import built_once

_META = ["op", "commit_lsn", "seq", "_commit_ts_us", "_unchanged", "_old_key_json", "_cdc_row_hash",
         "_cdc_delta", "_xid", "_read_view", "_staged_file", "_lsn", "_cdc_change"]  # fmt: skip
_XID_SPAN = 1 << 32


def position() -> Column:
    """The one order of changes: commit LSN, then position in the transaction."""
    return F.struct("commit_lsn", "seq")


def _precedes(a: Column, b: Column) -> Column:
    """Transaction id `a` is older than `b`: 32-bit ids compared modulo 2^32, as PostgreSQL does."""
    half = F.lit(_XID_SPAN // 2)
    return F.pmod(a - b + half, F.lit(_XID_SPAN)) < half


def visible(xid: Column, view: Column) -> Column:
    """Whether transaction `xid` had committed for a read with MVCC snapshot `view`: older
    than every transaction running then (xmin), or older than xmax and not running (xip)."""
    return _precedes(xid, view["xmin"]) | (
        _precedes(xid, view["xmax"]) & ~F.array_contains(view["xip"], xid)
    )


def view_column(read_view: dict[str, object]) -> Column:
    """A read's view (bronze's `read_view`, as a dict) as a literal struct, for `visible`."""
    return F.struct(*[F.lit(v).alias(k) for k, v in read_view.items()])


def with_phase(changes: DataFrame, key: list[str]) -> DataFrame:
    """`_phase` orders a key's changes around a snapshot read of it, by visibility, not by LSN:
    0 the read already saw it, 1 the read itself (or no read of this key), 2 it came after."""
    by_key = Window.partitionBy(*key)
    reads = F.when(F.col("_cdc_op") == "r", F.struct("_cdc_lsn", "_cdc_seq"))
    view = F.max_by(F.when(F.col("_cdc_op") == "r", F.col("_read_view")), reads).over(by_key)
    changes = changes.withColumn("_view", view)
    phase = (
        F.when(F.col("_cdc_op") == "r", 1)
        .when(F.col("_view").isNull() | F.col("_xid").isNull(), 1)
        .when(visible(F.col("_xid"), F.col("_view")), 0)
        .otherwise(2)
    )  # fmt: skip
    return changes.withColumn("_phase", phase).drop("_view")


def after_position(
    lsn: int, seq: int, *, lsn_column: str = "commit_lsn", seq_column: str = "seq"
) -> Column:
    """Changes strictly after (lsn, seq) in the order of `position` (bronze's column names
    unless told: typed changes have `_cdc_lsn` and `_cdc_seq`)."""
    return (F.col(lsn_column) > F.lit(lsn)) | (
        (F.col(lsn_column) == F.lit(lsn)) & (F.col(seq_column) > F.lit(seq))
    )


def _text_struct(shape: TableShape) -> T.StructType:
    return T.StructType([T.StructField(c.name, T.StringType()) for c in shape.columns])


# Bronze's JSON is the product's own: parse every string whole (Jackson stops at 20 M chars
# by default, a 10 MB bytea in hex) and fail loudly, never a row of NULLs (PERMISSIVE's way).
JSON_OPTIONS = {"maxStringLen": str(2**31 - 1), "mode": "FAILFAST"}


def parsed(bronze: DataFrame, shape: TableShape) -> DataFrame:
    """Each change's values as text: `after` for c/u/r, `before` for d (the key or old row)."""
    return bronze.select(*_parsed_columns(shape))


@built_once
def _parsed_columns(shape: TableShape) -> tuple[Column, ...]:
    text = _text_struct(shape)
    values = F.when(F.col("op") == "d", F.from_json("before", text, JSON_OPTIONS)).otherwise(
        F.from_json("after", text, JSON_OPTIONS)
    )
    key_type = T.StructType([T.StructField(k, T.StringType()) for k in shape.key])
    old_key = F.col("headers").getItem("__debezium.oldkey")
    return (
        F.col("op"), F.col("commit_lsn"), F.col("seq"),
        F.col("source.ts_us").alias("_commit_ts_us"),
        F.col("source.txId").alias("_xid"),
        F.col("source.lsn").alias("_lsn"),  # the change's own LSN: for a dead letter
        F.col("read_view").alias("_read_view"),
        F.when(F.col("op") == "t", F.col("staged_file")).alias("_staged_file"),  # a TRUNCATE's file
        F.coalesce("unchanged", F.array().cast("array<string>")).alias("_unchanged"),
        values.alias("_values"),
        (F.from_json(old_key, key_type, JSON_OPTIONS) if shape.key else F.lit(None)).alias(
            "_old_key"
        ),
        old_key.alias("_old_key_json"),
        F.from_json("before", text, JSON_OPTIONS).alias("_before"),
    )  # fmt: skip


def multiset_source(
    values: DataFrame, shape: TableShape, read_view: dict[str, object] | None = None
) -> DataFrame:
    """Row deltas of a table without a key: +1 for a row that appears, -1 for one that goes.
    A row is identified by its whole content (`_cdc_row_hash`); identical rows add up. With a
    snapshot read in the batch (`read_view`), changes the read already saw are left out."""
    if read_view is not None:
        seen = F.col("_xid").isNotNull() & visible(F.col("_xid"), view_column(read_view))
        seen = (F.col("op") != "r") & seen
        values = values.where(~seen)
    plus = values.where(F.col("op").isin("c", "r", "u")).withColumn("_cdc_delta", F.lit(1))
    minus = (
        values.where(F.col("op").isin("d", "u"))
        .withColumn("_values", F.col("_before"))
        .withColumn("_cdc_delta", F.lit(-1))
    )  # fmt: skip
    both = plus.unionByName(minus).withColumn("_cdc_row_hash", F.sha2(F.to_json("_values"), 256))
    newest = F.max_by(
        F.struct(*[c for c in both.columns if c not in ("_cdc_row_hash",)]), position()
    )
    grouped = both.groupBy("_cdc_row_hash").agg(
        newest.alias("_n"), F.sum("_cdc_delta").alias("_sum")
    )
    out = grouped.select("_cdc_row_hash", "_n.*", "_sum").drop("_cdc_delta")
    out = out.withColumnRenamed("_sum", "_cdc_delta")
    return out.where(F.col("_cdc_delta") != 0)


REFUSED = "_cdc_refused"  # with `refusals`: why silver cannot apply the change, else NULL
_CHANGE = "_cdc_change"  # a change of a table without a key, by its content


@dataclass(frozen=True)
class Refused:
    """`multiset_refusals`' result: the changes silver can apply (`parsed`'s columns), those it
    cannot as typed changes with `REFUSED` (`dead_letters.dead_letters` reads them), how many."""

    kept: DataFrame
    refused: DataFrame
    count: int


def multiset_refusals(values: DataFrame, shape: TableShape, modes: TypeModes) -> Refused:
    """The parsed changes of a table without a key that silver cannot apply, set apart from the
    rest: a value, of the row a change adds or of the row an update removes, that is not
    PostgreSQL's text of its type (the multiset source types them only after grouping, where a
    refusal could no longer be told to a change). A verdict depends on the change's content
    alone, so identical changes share theirs. The changes are materialized, read once."""
    changes = values.withColumn(
        _CHANGE, F.sha2(F.to_json(F.struct("op", "_values", "_before")), 256)
    ).localCheckpoint()
    adds = typed_with(changes, shape, modes, [], refusals=True)
    updates = changes.where(F.col("op") == "u").withColumn("_values", F.col("_before"))
    removes = typed_with(updates, shape, modes, [], refusals=True)
    if not adds.refused and not removes.refused:
        return Refused(changes.drop(_CHANGE), changes.limit(0), 0)
    added = adds.rows.where(F.col(REFUSED).isNotNull()).select(_CHANGE, REFUSED)
    removed = removes.rows.where(F.col(REFUSED).isNotNull()).select(
        _CHANGE, F.concat(F.lit("old row: "), F.col(REFUSED)).alias(REFUSED)
    )
    reasons = added.unionByName(removed.join(added, _CHANGE, "left_anti")).dropDuplicates([_CHANGE])
    names = [c.name for c in shape.columns]
    text = F.create_map(*[x for n in names for x in (F.lit(n), F.col("_values").getField(n))])
    refused = changes.join(reasons, _CHANGE).select(
        F.col("op").alias("_cdc_op"), F.col("commit_lsn").alias("_cdc_lsn"),
        F.col("seq").alias("_cdc_seq"), "_lsn", "_xid",
        F.timestamp_micros("_commit_ts_us").alias("_cdc_commit_ts"), "_old_key_json",
        F.map_filter(text, lambda _, v: v.isNotNull()).alias("_cdc_raw"), REFUSED,
    )  # fmt: skip
    kept = changes.join(reasons, _CHANGE, "left_anti").drop(_CHANGE)
    return Refused(kept, refused, refused.count())


def typed(changes: DataFrame, shape: TableShape, modes: TypeModes) -> DataFrame:
    """Typed silver columns from the text values, on executors; a value the silver type cannot
    hold exactly is NULL there and kept, exact, in `_cdc_raw`. The result is materialized
    (`localCheckpoint`): computed once, however often the caller reads it."""
    return typed_with(changes, shape, modes, []).rows


@dataclass(frozen=True)
class Typed:
    """`typed_with`'s result: the typed changes, the aggregates' row (None without aggregates)
    and, with `refusals`, how many changes silver cannot apply (their `REFUSED` is set)."""

    rows: DataFrame
    found: Row | None
    refused: int = 0


def typed_with(
    changes: DataFrame, shape: TableShape, modes: TypeModes, aggregates: Sequence[Column],
    *, refusals: bool = False,
) -> Typed:  # fmt: skip
    """`typed`, and `aggregates` over the changes' own columns (`op`, `commit_lsn`, `seq`,
    `_unchanged`, `_staged_file`: `parsed`'s names), computed from the materialized rows in the
    job that looks for values only Python can type: a summary without a pass of its own over
    bronze. With `refusals`, a change silver cannot apply (a key value its type cannot hold, a
    value that is not PostgreSQL's text of its type) does not stop the job: it is kept with
    `REFUSED` saying why and `_cdc_raw` holding every value's text; without, it raises."""
    cols = [c for c in changes.columns if c in _META]
    inputs = (
        changes.select(*cols, "_values", "_old_key")
        if shape.key
        else changes.select(*cols, "_values")
    )
    fields = [T.StructField(c.name, spark_type(c.silver)) for c in shape.columns]
    types = {f.name: f.dataType for f in fields}
    old = [T.StructField(f"_old_{k}", types[k]) for k in shape.key]
    meta = [f for f in inputs.schema.fields if f.name in _META]
    raw = T.StructField("_cdc_raw", T.MapType(T.StringType(), T.StringType()))
    flag = [T.StructField(REFUSED, T.StringType())] if refusals else []
    out = T.StructType(meta + fields + old + [raw] + flag)
    convert = functools.partial(_convert_batches, shape=shape, modes=modes, schema=out)
    texts = tuple(c for c in ("_values", "_old_key") if c in inputs.columns)
    split = _split(shape, modes, tuple(f.name for f in meta), texts, refusals=refusals)
    found = None
    refused = 0
    counted = [F.count(REFUSED).alias("__cdc_refused")] if refusals else []
    if split is None:
        result = inputs.mapInArrow(convert, out).localCheckpoint()
        if aggregates or refusals:
            found = result.agg(*aggregates, *counted).first()
            refused = int(found["__cdc_refused"]) if refusals and found else 0
    else:  # rows whose every value has its plain form are typed in the JVM, the rest in Python
        staged = inputs.select(*split.staged).localCheckpoint()
        quick = staged.where(split.plain).select(*split.quick)
        rest = staged.where(~split.plain).select(*split.rest)
        found = staged.agg(split.slow, *aggregates).first()
        if found is None or not found["__cdc_slow"]:
            result = quick
        else:
            slow = rest.mapInArrow(convert, out).localCheckpoint()
            if refusals:  # only the few rows Python typed can be refused
                refused = int(slow.agg(*counted).first()[0])  # type: ignore[index]
            result = quick.unionByName(slow)
    rows = (
        result.withColumnRenamed("commit_lsn", "_cdc_lsn")
        .withColumnRenamed("seq", "_cdc_seq")
        .withColumnRenamed("op", "_cdc_op")
        .withColumn("_cdc_commit_ts", F.timestamp_micros("_commit_ts_us"))
    )  # fmt: skip
    return Typed(rows, found if aggregates else None, refused)


@dataclass(frozen=True)
class _Split:
    """`typed_with`'s selections when every column has a fast path: one pass (`staged`) types
    every value in the JVM (a value and its check share their expressions) and keeps the text
    of the rows only Python can type; the rows typed (`quick`) and those left (`rest`) are
    read from its result, `slow` counts the latter."""

    staged: tuple[Column, ...]
    plain: Column
    quick: tuple[Column, ...]
    rest: tuple[Column, ...]
    slow: Column


@built_once
def _split(
    shape: TableShape, modes: TypeModes, meta: tuple[str, ...], texts: tuple[str, ...], *,
    refusals: bool,
) -> _Split | None:  # fmt: skip
    """None when some column's type has no fast path. `meta`: the changes' own columns kept as
    they are; `texts`: their text values (`_values`, and `_old_key` for a keyed table)."""
    fast = _fast_columns(shape, modes)
    if fast is None:
        return None
    exprs, plain = fast
    typed_names = [c.name for c in shape.columns] + [f"_old_{k}" for k in shape.key]
    raw = T.MapType(T.StringType(), T.StringType())
    plain_row = F.col("__cdc_plain")
    return _Split(
        staged=(
            *[F.col(m) for m in meta], *exprs, plain.alias("__cdc_plain"),
            *[F.when(~plain, F.col(c)).alias(c) for c in texts],
        ),
        plain=plain_row,
        quick=(
            *[F.col(m) for m in meta], *[F.col(quoted(n)) for n in typed_names],
            F.create_map().cast(raw).alias("_cdc_raw"),
            *([F.lit(None).cast("string").alias(REFUSED)] if refusals else []),
        ),
        rest=(*[F.col(m) for m in meta], *[F.col(c) for c in texts]),
        slow=F.count_if(~plain_row).alias("__cdc_slow"),
    )  # fmt: skip


def _fast_columns(shape: TableShape, modes: TypeModes) -> tuple[tuple[Column, ...], Column] | None:
    """JVM expressions for every typed column (and old key), and the condition under which they
    are all exact; None when some column's type has no fast path."""
    exprs: list[Column] = []
    plain: list[Column] = []
    by_name = {c.name: c for c in shape.columns}
    sources = [(c.name, F.col("_values").getField(c.name), c) for c in shape.columns] + [
        (f"_old_{k}", F.col("_old_key").getField(k), by_name[k]) for k in shape.key
    ]
    for name, text, column in sources:
        value = fast_value(column.pg, modes, text)
        if value is None:
            return None
        exprs.append(value.alias(name))
        plain.append(text.isNull() | value.isNotNull())
    # a NULL key (in a message.key.columns column) is refused: Python says why
    plain += [(F.col("op") == "t") | F.col("_values").getField(k).isNotNull() for k in shape.key]
    return tuple(exprs), F.coalesce(all_of(plain), F.lit(False))


def all_of(conditions: list[Column]) -> Column:
    """`c1 AND c2 AND ...` as a balanced tree: a chain of 500 (a wide table) overflows the
    JVM's stack where Spark converts and analyses expressions recursively."""
    if not conditions:
        return F.lit(True)
    while len(conditions) > 1:
        pairs = zip(conditions[::2], conditions[1::2], strict=False)
        conditions = [a & b for a, b in pairs] + conditions[len(conditions) // 2 * 2 :]
    return conditions[0]


def _convert_batches(
    batches: Iterator[pa.RecordBatch], shape: TableShape, modes: TypeModes, schema: T.StructType
) -> Iterator[pa.RecordBatch]:
    converters = [(c.name, converter(c.pg, modes)) for c in shape.columns]
    by_name = dict(converters)
    refusals = REFUSED in schema.fieldNames()  # else a refused change raises
    typed_names = [n for n, _ in converters] + [f"_old_{k}" for k in shape.key]
    target = pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in schema.fields])
    for batch in batches:
        rows = batch.to_pylist()
        out: dict[str, list[object]] = {f.name: [] for f in schema.fields}
        for i, row in enumerate(rows):
            raw: dict[str, str] = {}
            values = row["_values"] or {}
            old_key = row.get("_old_key") or {}
            old_raw: dict[str, str] = {}
            reason: str | None = None
            unsent = frozenset(row.get("_unchanged") or ())  # the placeholder, not a value:
            try:  # the MERGE keeps the stored one (Debezium's for some arrays is no array text)
                for name, convert in converters:
                    text = None if name in unsent else values.get(name)
                    out[name].append(_value(convert, text, name, raw))
                for k in shape.key:
                    out[f"_old_{k}"].append(_value(by_name[k], old_key.get(k), k, old_raw))
            except ValueError as e:  # not PostgreSQL's text of the type
                if not refusals:
                    raise ValueError(unreadable_value(shape, str(e))) from e
                reason = _blanked(out, typed_names, i, e)
            held = _unmatched(shape, row["op"], values, raw, old_raw)
            if held and reason is None:  # a key silver cannot hold: the row could not be matched
                reason = _key_held(shape, *held, refusals=refusals)
            if reason is None:
                out["_cdc_raw"].append(list(raw.items()))
            else:  # set aside: every value's text, for the dead letter
                out["_cdc_raw"].append([(n, v) for n, v in values.items() if v is not None])
            if refusals:
                out[REFUSED].append(reason)
            for name, column in out.items():
                if name in row and name not in ("_values", "_old_key"):
                    column.append(row[name])
        yield pa.RecordBatch.from_arrays(
            [_array(out[f.name], f.type) for f in target], schema=target
        )


def _unmatched(
    shape: TableShape, op: str, values: dict[str, str | None], raw: dict[str, str],
    old_raw: dict[str, str],
) -> tuple[str, str | None] | None:  # fmt: skip
    """A key column whose value would match no row, and its text: one its silver type cannot
    hold (`raw`, `old_raw`: the texts kept of such values), or NULL (a message.key.columns
    column may be nullable)."""
    held: list[tuple[str, str | None]] = [(k, raw[k]) for k in shape.key if k in raw]
    held += list(old_raw.items())
    if op != "t":
        held += [(k, None) for k in shape.key if values.get(k) is None]
    return held[0] if held else None


def _blanked(out: dict[str, list[object]], names: list[str], row: int, e: ValueError) -> str:
    """A refused row's typed values, NULL (those appended before the error are dropped)."""
    for name in names:
        del out[name][row:]
        out[name].append(None)
    return str(e)


def _key_held(shape: TableShape, name: str, text: str | None, *, refusals: bool) -> str:
    if not refusals:
        raise ValueError(unrepresentable_key(shape, name, text))
    return held_key(shape, name, text)


_KEY_REFUSED = "cdc-lake refuses the key: "
_VALUE_REFUSED = "cdc-lake refuses a value: "


def held_key(shape: TableShape, name: str, text: str | None) -> str:
    """Why a change whose key value its silver type cannot hold is not applied."""
    if text is None:
        return (
            f"key column {name} is NULL, which matches no row (message.key.columns may name a "
            "nullable column; NULL is not a key)"
        )
    column = next(c for c in shape.columns if c.name == name)
    return (
        f"key column {name} holds {text[:200]!r}, which its silver type "
        f"({describe(column.silver)}) cannot hold"
    )


def unrepresentable_key(shape: TableShape, name: str, text: str | None) -> str:
    """Why a key value its silver type cannot hold stops the mirror: NULL there, the row would
    match no other change of it (an update would add a row, a delete remove nothing)."""
    return (
        f"{_KEY_REFUSED}table {shape.qualified}: {held_key(shape, name, text)}, so its changes "
        "could not be matched by key. The mirror stops here; other tables go on. To move on, "
        "key the table by columns whose values silver holds (message.key.columns), or choose "
        "a mode that keeps the column's text, or leave the table out, or set "
        "silver.event.processing.failure.handling.mode to warn or skip (such changes then go "
        "to the dead-letter table _state/dead_letters)"
    )


def unreadable_value(shape: TableShape, reason: str) -> str:
    """Why a value that is not PostgreSQL's text of its type stops the mirror (`reason` names
    the column and the value): silver never guesses around it."""
    return (
        f"{_VALUE_REFUSED}table {shape.qualified}: {reason}. The mirror stops here; other "
        "tables go on. To move on, leave the table out, or set "
        "silver.event.processing.failure.handling.mode to warn or skip (such changes then go "
        "to the dead-letter table _state/dead_letters)"
    )


def refusal(error: BaseException) -> str | None:
    """The message of an `unrepresentable_key` or `unreadable_value` refusal raised on an
    executor, if `error` is one (Spark wraps it in a Python worker's traceback)."""
    text = str(error)
    for marker in (_KEY_REFUSED, _VALUE_REFUSED):
        at = text.find(marker)
        if at >= 0:
            return text[at + len(marker) :].splitlines()[0]
    return None


def _value(convert: object, text: str | None, name: str, raw: dict[str, str]) -> object:
    if text is None:
        return None
    try:
        return convert(text)  # type: ignore[operator]
    except Unrepresentable:
        raw[name] = text
        return None
    except ValueError as e:  # not PostgreSQL's output of the type: a bug, never guessed around
        raise ValueError(f"column {name}: cannot read {text[:200]!r} as its type: {e}") from e


def _array(values: list[object], arrow: pa.DataType) -> pa.Array:
    if pa.types.is_decimal(arrow):
        values = [v if v is None or isinstance(v, Decimal) else Decimal(str(v)) for v in values]
    return pa.array(values, arrow)


def keyed_source(
    changes: DataFrame, shape: TableShape, target: DataFrame, unsent: list[str] | None = None,
    *, reads: bool = True,
) -> DataFrame:  # fmt: skip
    """The newest change per key, with unchanged TOASTed values resolved where the batch or the
    stored row of an old key (after a primary-key change) knows them. `unsent`: the columns
    some change did not carry, when the caller knows them already; `reads`: whether the batch
    may hold snapshot reads (their keys' changes are then ordered around them by visibility).
    A value left in `_unchanged` is the stored row's (the MERGE keeps it); one in `_unknown`
    no change or row of the lake knows: NULL, and listed in the mirror's `_cdc_unavailable`."""
    changes = (
        with_phase(changes, list(shape.key)) if reads else changes.withColumn("_phase", F.lit(1))
    )
    changes = changes.withColumn("_unknown", _none())
    resolvable = unsent_columns(changes) if unsent is None else unsent
    if resolvable:
        changes = _resolve_unsent(changes, shape, target, resolvable)
    key = [F.col(k) for k in shape.key]
    order = [c.desc() for c in (*map(F.col, ("_phase", "_cdc_lsn", "_cdc_seq")), _pair_order())]
    newest = Window.partitionBy(*key).orderBy(*order)
    ranked = changes.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1")
    return ranked.drop("_rank", "_phase")


def _pair_order() -> Column:
    """A key change is a d of the old key and a c of the new at one position, the c after: two
    texts of one typed key (a float 0 and -0; numeric 1.10 and 1.1 typed as a double) make
    the pair one key's two changes, of which the c is the newer."""
    return F.col("_cdc_op") != "d"


def unsent_columns(changes: DataFrame) -> list[str]:
    """The columns some of the typed `changes` did not carry (unchanged TOAST), sorted."""
    return sorted(r[0] for r in changes.select(F.explode("_unchanged")).distinct().collect())


def _none() -> Column:
    return F.array().cast("array<string>")


def _moved() -> Column:
    """The row came to its key by a key change."""
    return F.col("_old_key_json").isNotNull()


_MOVE_PASSES = 32  # key changes of one row, one after the other, that one batch follows


def _resolve_unsent(
    changes: DataFrame, shape: TableShape, target: DataFrame, names: list[str]
) -> DataFrame:  # fmt: skip
    """A value a change did not send is the one its row had just before: on the same key, the
    latest earlier change's; after a key change, the old key's, from the batch or its stored
    row. A row can move several times in one batch, and be changed between moves: each pass
    resolves the moves whose old key's value is known, and the changes after them, until no
    move waits for another (`_waiting`)."""
    changes = _from_earlier_changes(changes.withColumn("_waiting", _none()), shape, names)
    if not changes.where(_moved() & (F.size("_unchanged") > 0)).limit(1).count():
        return changes.drop("_waiting")
    for _ in range(_MOVE_PASSES):
        changes = _across_key_changes(changes, shape, target, names)
        changes = _from_earlier_changes(changes, shape, names).localCheckpoint()
        if not changes.where(_moved() & (F.size("_waiting") > 0)).limit(1).count():
            break
    # A longer chain in one batch (never seen): what still waits is not known, never guessed.
    for name in names:
        waiting = F.array_contains("_waiting", name)
        changes = changes.withColumn(name, F.when(waiting, None).otherwise(F.col(name)))
    return changes.withColumns({
        "_unchanged": F.array_except("_unchanged", "_waiting"),
        "_unknown": F.array_union("_unknown", "_waiting"),
    }).drop("_waiting")  # fmt: skip


def _before_it(op: Column, *, unsent: Column, lost: Column, waits: Column) -> Column:
    """What an earlier change says of a column's value for a later change that did not send
    it: `d` deleted, `u` not known, `v` its value, `m` not yet known (a move, or a change
    waiting for one); NULL: nothing, look further back (it did not send it either)."""
    return F.when(op == "d", "d").when(lost, "u").when(~unsent, "v").when(waits, "m")


def _marks(unsent: list[Column]) -> Column:
    """The names of the columns whose condition holds, as `_unchanged` and its kin hold them."""
    return F.filter(F.array(*unsent), lambda c: c.isNotNull())


def _from_earlier_changes(changes: DataFrame, shape: TableShape, names: list[str]) -> DataFrame:
    """A value not sent takes the one its key's latest earlier change carried. The search stops
    at a change that did not carry it either and came by a key change (the row's value is then
    the old key's: `_waiting`, until that move is resolved), at a delete or at a value not
    known (`_unknown`: a row after a delete has no earlier value). With none of these, the
    value stays unsent: the stored row's. A key change's own row takes a value only from a
    change its new key had just before it that carried one: the snapshot read a missed move
    re-keyed (`snapshot_window`), ordered before the move by visibility; a key is free before
    a move into it otherwise, and the old key's value is `_across_key_changes`' to find."""
    earlier = (
        Window.partitionBy(*shape.key).orderBy("_phase", "_cdc_lsn", "_cdc_seq", _pair_order())
        .rowsBetween(Window.unboundedPreceding, -1)
    )  # fmt: skip
    flags: dict[str, list[Column]] = {"_unchanged": [], "_waiting": [], "_unknown": []}
    for n, name in enumerate(names):
        unsent = F.array_contains("_unchanged", name)
        lost = F.array_contains("_unknown", name)
        kind = _before_it(F.col("_cdc_op"), unsent=unsent, lost=lost, waits=_moved())
        mark = F.when(kind.isNotNull(), F.struct(kind.alias("k"), F.col(name).alias("v"),
                                                 _raw_of(name).alias("r")))  # fmt: skip
        changes = changes.withColumn("_prev", F.last(mark, ignorenulls=True).over(earlier))
        todo = unsent & ~_moved()
        found = F.coalesce(F.col("_prev.k"), F.lit(""))
        known, gone = unsent & (found == "v"), todo & found.isin("d", "u")
        waits = (todo & (found == "m")) | (_moved() & F.array_contains("_waiting", name) & ~known)
        changes = changes.withColumns({
            f"_s{n}": unsent & ~known & ~gone, f"_w{n}": waits, f"_u{n}": lost | gone,
            name: F.when(known, F.col("_prev.v")).when(gone, None).otherwise(F.col(name)),
            "_cdc_raw": _with_raw(name, F.when(known, F.col("_prev.r"))),
        })  # fmt: skip
        for flag, column in zip(flags, (f"_s{n}", f"_w{n}", f"_u{n}"), strict=True):
            flags[flag].append(F.when(F.col(column), F.lit(name)))
    changes = changes.withColumns({flag: _marks(marked) for flag, marked in flags.items()})
    return changes.drop("_prev", *[f"_{f}{n}" for f in "swu" for n in range(len(names))])


def _raw_of(name: str) -> Column:
    """The text `_cdc_raw` keeps of a column's value its silver type cannot hold, or NULL."""
    return F.col("_cdc_raw").getItem(name)


def _with_raw(name: str, text: Column, raw: Column | None = None) -> Column:
    """`_cdc_raw` (or `raw`) with the text of `name`'s value where `text` is not NULL: a value
    taken from an earlier change or a stored row brings the text kept of it along (the change
    that did not send it has no text of it)."""
    raw = F.col("_cdc_raw") if raw is None else raw
    return F.when(text.isNull(), raw).otherwise(F.map_concat(raw, F.create_map(F.lit(name), text)))


def _across_key_changes(
    changes: DataFrame, shape: TableShape, target: DataFrame, names: list[str]
) -> DataFrame:
    """A key change's row takes a value it did not send from its old key just before it: the
    latest earlier change of that key in the batch that carried it, else that key's stored row.
    It waits (`_waiting`) when that change is itself waiting for a move, and is not known
    (`_unknown`) after a delete, or with no row to take it from."""
    todo = _moved() & (F.size("_unchanged") > 0)
    moved = changes.where(todo)
    ident = [*shape.key, "_cdc_lsn", "_cdc_seq"]
    earlier = changes.select(
        *[F.col(k).alias(f"_e_{k}") for k in shape.key],
        F.struct("_cdc_lsn", "_cdc_seq").alias("_e_pos"), F.col("_cdc_op").alias("_e_op"),
        _moved().alias("_e_moved"), F.col("_unchanged").alias("_e_unch"),
        F.col("_unknown").alias("_e_lost"), F.col("_waiting").alias("_e_wait"),
        *[F.col(n).alias(f"_e_{n}") for n in names],
        *[_raw_of(name).alias(f"_e_r{n}") for n, name in enumerate(names)],
    )  # fmt: skip
    pointers = moved.select(*ident, *[f"_old_{k}" for k in shape.key])
    on = [pointers[f"_old_{k}"] == earlier[f"_e_{k}"] for k in shape.key] + [
        earlier["_e_pos"] < F.struct(pointers["_cdc_lsn"], pointers["_cdc_seq"])
    ]
    latest = []
    for n, name in enumerate(names):
        unsent = F.array_contains("_e_unch", name)
        waits = F.col("_e_moved") | F.array_contains("_e_wait", name)
        lost = F.array_contains("_e_lost", name)
        kind = _before_it(F.col("_e_op"), unsent=unsent, lost=lost, waits=waits)
        mark = F.struct(
            kind.alias("k"), F.col(f"_e_{name}").alias("v"), F.col(f"_e_r{n}").alias("r")
        )
        latest.append(F.max_by(mark, F.when(kind.isNotNull(), F.col("_e_pos"))).alias(f"_f{n}"))
    found = pointers.join(earlier, on, "left")
    found = found.groupBy(*ident).agg(*latest)
    stored = target.where(~F.col("_cdc_deleted")).select(
        F.lit(True).alias("_stored"), F.col("_cdc_unavailable").alias("_s_lost"),
        *[F.col(k).alias(f"_old_{k}") for k in shape.key],
        *[F.col(n).alias(f"_s_{n}") for n in names],
        *[_raw_of(name).alias(f"_s_r{n}") for n, name in enumerate(names)],
    )  # fmt: skip
    picked = moved.join(found, ident, "left").join(stored, [f"_old_{k}" for k in shape.key], "left")
    flags: dict[str, list[Column]] = {"_unchanged": [], "_waiting": [], "_unknown": []}
    values = {}
    raw = F.col("_cdc_raw")
    for n, name in enumerate(names):
        unsent = F.array_contains("_unchanged", name)
        found_kind = F.coalesce(F.col(f"_f{n}.k"), F.lit(""))
        from_batch = unsent & (found_kind == "v")
        waits = unsent & (found_kind == "m")
        stored_ok = (
            unsent & (found_kind == "") & F.col("_stored").isNotNull()
            & ~F.array_contains(F.coalesce("_s_lost", _none()), name)
        )  # fmt: skip
        lost = F.array_contains("_unknown", name) | (unsent & ~from_batch & ~waits & ~stored_ok)
        values[name] = (
            F.when(from_batch, F.col(f"_f{n}.v")).when(stored_ok, F.col(f"_s_{name}"))
            .when(lost, None).otherwise(F.col(name))
        )  # fmt: skip
        taken = F.when(from_batch, F.col(f"_f{n}.r")).when(stored_ok, F.col(f"_s_r{n}"))
        raw = _with_raw(name, taken, raw)
        flags["_unchanged"].append(F.when(waits, F.lit(name)))
        flags["_waiting"].append(F.when(waits, F.lit(name)))
        flags["_unknown"].append(F.when(lost, F.lit(name)))
    picked = picked.withColumns(
        values | {flag: _marks(m) for flag, m in flags.items()} | {"_cdc_raw": raw}
    )
    return changes.where(~todo).unionByName(picked.select(*changes.columns))
