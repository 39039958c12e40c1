"""`cdc validate`, Spark side: the canonical encoding as Spark expressions over one silver version.

A silver table is read at one Delta version for a whole round (time travel), so every query
sees the same rows. Soft-deleted rows (`_cdc_deleted`) are left out when the pipeline soft
deletes; a table without a key is a multiset whose rows count `_cdc_count` times. Values the
typed column cannot hold are read from `_cdc_raw`, columns never seen (`_cdc_unavailable`) give
a token no source value has.
Nothing here imports psycopg.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.silver_shape import SilverColumn, spark_type
from cdc_core.validate_encoding import SHOWN_CHARS, TWICE, UNAVAILABLE
from cdc_core.validate_ranges import Bucket, Ranges, RowDigest

_WEIGHT = "_w"


def _v(payload: Column) -> Column:
    return F.concat(F.lit("V"), F.length(payload).cast("string"), F.lit(":"), payload)


def _payload(x: Column, t: T.DataType) -> Column:
    if isinstance(t, T.BooleanType):
        return F.when(x, F.lit("t")).otherwise(F.lit("f"))
    if isinstance(t, T.FloatType | T.DoubleType):
        return F.format_string("%a", x.cast("double"))  # Java's hexadecimal form: every bit
    if isinstance(t, T.BinaryType):
        return F.lower(F.hex(x))
    if isinstance(t, T.DateType):
        return F.unix_date(x).cast("string")
    if isinstance(t, T.TimestampType):
        return F.unix_micros(x).cast("string")
    if isinstance(t, T.TimestampNTZType):
        return F.unix_micros(x.cast("timestamp")).cast("string")  # the session runs in UTC
    return x.cast("string")  # integers, decimals (plain text, all scale digits), strings


def _token(x: Column, t: T.DataType) -> Column:
    """The token of a value that may be NULL."""
    return F.when(x.isNull(), F.lit("N")).otherwise(_typed(x, t))


def _typed(x: Column, t: T.DataType) -> Column:
    if isinstance(t, T.ArrayType):
        element = t.elementType
        body = F.array_join(F.transform(x, lambda e: _token(e, element)), "")
        return F.concat(F.lit("A"), F.size(x).cast("string"), F.lit(":"), body)
    if isinstance(t, T.MapType):
        value = t.valueType
        entries = F.array_sort(F.map_entries(x))  # by key, in byte order (binary collation)
        body = F.array_join(
            F.transform(entries, lambda e: F.concat(_v(e["key"]), _token(e["value"], value))), ""
        )
        return F.concat(F.lit("M"), F.size(x).cast("string"), F.lit(":"), body)
    if isinstance(t, T.StructType):
        fields = [_token(x.getField(f.name), f.dataType) for f in t.fields]
        return F.concat(F.lit(f"S{len(t.fields)}:"), *fields)
    return _v(_payload(x, t))


def column_token(c: SilverColumn) -> Column:
    """The token of silver column `c` per `cdc_core.validate_encoding`."""
    x = F.col(_quoted(c.name))
    raw = F.col("_cdc_raw").getItem(c.name)
    unavailable = F.array_contains(F.coalesce("_cdc_unavailable", F.array()), c.name)
    # silver keeps a value in `_cdc_raw` only when its typed column cannot hold it, and then
    # the typed column is NULL: a typed value next to the text is a mirror users read wrong
    return (
        F.when(raw.isNotNull() & x.isNotNull(), F.lit(TWICE))
        .when(raw.isNotNull(), F.concat(F.lit("R"), F.length(raw).cast("string"), F.lit(":"), raw))
        .when(unavailable, F.lit(UNAVAILABLE))
        .otherwise(_token(x, spark_type(c.silver)))
    )  # fmt: skip


def _h60(text: Column) -> Column:
    return F.conv(F.substring(F.md5(text), 1, 15), 16, 10).cast("long")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _shown(c: SilverColumn) -> Column:
    x = F.col(_quoted(c.name))
    text = F.lower(F.hex(x)) if c.silver.name == "binary" else x.cast("string")
    return F.substring(text, 1, SHOWN_CHARS)


def live_rows(silver: DataFrame, keyed: bool, soft_delete: bool) -> DataFrame:
    """The rows the mirror says the source has, with their weight. Soft-deleted rows are left
    out only with `soft_delete`: users filter `_cdc_deleted` then; without it every row is
    one they read (a row marked deleted there, left by an earlier soft_delete, say, is one)."""
    rows = silver
    if soft_delete:
        rows = rows.where(~F.coalesce(F.col("_cdc_deleted"), F.lit(False)))
    if keyed:
        return rows.withColumn(_WEIGHT, F.lit(1).cast("long"))
    return rows.where(F.col("_cdc_count") > 0).withColumn(_WEIGHT, F.col("_cdc_count"))


def read_version(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


class SilverTable:
    """One silver table at one version: a `Side` of the comparison."""

    def __init__(
        self, silver: DataFrame, columns: Sequence[SilverColumn], key: Sequence[str], *,
        soft_delete: bool, keyed: bool | None = None,
    ) -> None:  # fmt: skip
        """`key`: the columns rows are matched by (none: rows are a multiset); `keyed`: whether
        the mirror has a key (its rows count once each), when that differs from `key`."""
        self.columns = tuple(columns)
        self.key = tuple(key)
        rows = live_rows(silver, bool(key) if keyed is None else keyed, soft_delete)
        tokens = [column_token(c).alias(f"_t{i}") for i, c in enumerate(self.columns)]
        at = {c.name: i for i, c in enumerate(self.columns)}
        shown = [_shown(self.columns[at[k]]) for k in self.key] or [_shown(c) for c in columns]
        self._tokens = rows.select(*tokens, F.array(*shown).alias("_shown"), _WEIGHT)
        names = [F.col(f"_t{i}") for i in range(len(self.columns))]
        row = F.concat(*names)
        key_text = F.concat(*[names[at[k]] for k in self.key]) if self.key else row
        self._detail = self._tokens.select(
            _h60(key_text).alias("kh"), _h60(row).alias("rh"),
            (key_text if self.key else F.lit("")).alias("kt"), "_shown",
            F.array(*[_h60(n) for n in names]).alias("cols"), _WEIGHT,
        )  # fmt: skip
        self._hashes = self._detail.select("kh", "rh", _WEIGHT).persist(
            StorageLevel.MEMORY_AND_DISK
        )

    def close(self) -> None:
        self._hashes.unpersist()

    def count(self) -> int:
        row = self._hashes.agg(F.sum(_WEIGHT)).first()
        return int(row[0] or 0) if row else 0

    def buckets(self, depth: int, within: Ranges | None) -> dict[int, Bucket]:
        rows = self._hashes if within is None else self._hashes.where(_in(within))
        total = F.col("rh").cast("decimal(38,0)") * F.col(_WEIGHT).cast("decimal(38,0)")
        grouped = rows.groupBy(F.shiftright("kh", 60 - depth).alias("b")).agg(
            F.sum(_WEIGHT).alias("n"), F.sum(total).alias("s")
        )
        return {int(r["b"]): Bucket(int(r["n"]), int(r["s"])) for r in grouped.collect()}

    def rows(self, within: Ranges) -> list[RowDigest]:
        return self._fetch(self._detail.where(_in(within)))

    def key_hashes(self) -> list[int]:
        """The key hash of every row (of every row's content, without a key), once each."""
        return [int(r["kh"]) for r in self._hashes.select("kh").distinct().collect()]

    def rows_for(self, key_hashes: Sequence[int]) -> list[RowDigest]:
        return self._fetch(self._detail.where(F.col("kh").isin(list(key_hashes))))

    def _fetch(self, rows: DataFrame) -> list[RowDigest]:
        return [
            RowDigest(
                int(r["kh"]),
                str(r["kt"]),
                tuple(r["_shown"]),
                int(r["rh"]),
                tuple(int(h) for h in r["cols"]),
                int(r[_WEIGHT]),
            )
            for r in rows.collect()
        ]


def _in(within: Ranges) -> Column:
    return F.shiftright("kh", within.shift).isin(list(within.ids))
