"""`cdc validate`, PostgreSQL side: the canonical encoding in SQL, read in one snapshot.

Every query of one validation round runs in one REPEATABLE READ, READ ONLY transaction, so
counts, range hashes and rows all describe the same state of the source; its first statement
records the WAL position of that snapshot and the slot's confirmed position. Values are read
in a session with the product's output settings (`VALUE_SETTINGS`), so text matches what
pgoutput sent. Nothing here imports pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from cdc_core.config import Dsn
from cdc_core.events import RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg.catalog import own_rows
from cdc_core.pg.connect import connect
from cdc_core.pg.replication import publication_names
from cdc_core.pgtypes import ColumnType
from cdc_core.snapshot import catalog_descriptor
from cdc_core.validate_encoding import RAW_FORMS, SHOWN_CHARS, PgForm, TextStep
from cdc_core.validate_ranges import Bucket, Ranges, RowDigest

Conn = psycopg.Connection[tuple[object, ...]]

_POSITIONS = """
SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
            ELSE pg_current_wal_insert_lsn() END::text,
       (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s)
"""


@dataclass(frozen=True)
class SourceColumn:
    """A compared column as PostgreSQL encodes it."""

    name: str
    type: ColumnType  # as the catalog has it now
    form: PgForm
    steps: tuple[TextStep, ...] = ()  # the pipeline's column transforms, repeated in SQL
    money_digits: int = 2  # the scale silver gives money (money.fraction.digits when precise)


@dataclass(frozen=True)
class Snapshot:
    """Where one source snapshot stands in the WAL."""

    lsn: Lsn  # the WAL insert position when it was taken: every change it sees is before
    confirmed: Lsn | None  # the slot's confirmed position then (None: no such slot)


def _q(template: str, **parts: sql.Composable) -> sql.Composed:
    return sql.SQL(template).format(**parts)


def _v(payload: sql.Composable) -> sql.Composed:
    """The value token of a payload: V<length>:<payload>."""
    return _q("('V' || length({p}) || ':' || {p})", p=payload)


def _hex_float(x: sql.Composable) -> sql.Composed:
    """A float8 in Java's `%a` form, from its bits (NaN, infinities and -0 included)."""
    return _q(
        "(SELECT CASE WHEN f.v = 'NaN' THEN 'NaN' WHEN f.v = 'Infinity' THEN 'Infinity' "
        "WHEN f.v = '-Infinity' THEN '-Infinity' ELSE (CASE WHEN f.b < 0 THEN '-' ELSE '' END) "
        "|| '0x' || (CASE WHEN f.e = 0 THEN '0.' ELSE '1.' END) "
        "|| coalesce(nullif(rtrim(lpad(to_hex(f.m), 13, '0'), '0'), ''), '0') || 'p' "
        "|| (CASE WHEN f.e > 0 THEN (f.e - 1023)::text WHEN f.m = 0 THEN '0' ELSE '-1022' END) "
        "END FROM (SELECT g.v, g.b, (g.b >> 52) & 2047 AS e, g.b & 4503599627370495 AS m "
        "FROM (SELECT ({x})::float8 AS v, ('x' || encode(float8send(({x})::float8), 'hex'))"
        "::bit(64)::bigint AS b) AS g) AS f)",
        x=x,
    )


_DOUBLE_OVERFLOW = sql.SQL(str(2**1024 - 2**970))  # halfway past the largest double: rounds up
_DOUBLE_UNDERFLOW = sql.SQL(f"{5**1075}e-1075")  # 2^-1075, half the least double: rounds to 0


def _numeric_float8(x: sql.Composable) -> sql.Composed:
    """A numeric as the float8 nearest it, as silver's `BigDecimal.doubleValue` rounds it: past
    a double's range ±Infinity, below its least value ±0 (`numeric::float8` refuses both)."""
    return _q(
        "(CASE WHEN {x} = 'NaN' THEN 'NaN'::float8 "
        "WHEN abs({x}) >= {over} THEN CASE WHEN {x} > 0 THEN 'Infinity'::float8 "
        "ELSE '-Infinity'::float8 END "
        "WHEN abs({x}) <= {under} THEN CASE WHEN {x} < 0 THEN '-0'::float8 ELSE 0::float8 END "
        "ELSE ({x})::float8 END)",
        x=x, over=_DOUBLE_OVERFLOW, under=_DOUBLE_UNDERFLOW,
    )  # fmt: skip


def _micros(x: sql.Composable) -> sql.Composed:
    return _q("(extract(epoch FROM {x}) * 1000000)::bigint::text", x=x)


def _interval_micros(x: sql.Composable) -> sql.Composed:
    """Debezium's µs of an interval: a month is 30.4375 days (2,629,800 s), a year 12 months."""
    return _q(
        "((extract(year FROM {x}) * 12 + extract(month FROM {x})) * 2629800000000 "
        "+ extract(day FROM {x}) * 86400000000 + extract(hour FROM {x}) * 3600000000 "
        "+ extract(minute FROM {x}) * 60000000 + extract(microseconds FROM {x}))",
        x=x,
    )


def _text(x: sql.Composable, steps: Sequence[TextStep]) -> sql.Composable:
    out: sql.Composable = _q("concat({x})", x=x)
    for step in steps:
        if step.kind == "truncate":
            out = _q("left({t}, {n})", t=out, n=sql.Literal(step.length))
        elif step.kind == "mask":
            out = _q("repeat('*', {n})", n=sql.Literal(step.length))
        else:
            data = _q("convert_to({salt} || {t}, 'UTF8')", salt=sql.Literal(step.salt), t=out)
            if step.algorithm == "md5":
                out = _q("md5({d})", d=data)
            else:
                out = _q("encode({f}({d}), 'hex')", f=sql.Identifier(step.algorithm), d=data)
            if step.length:
                out = _q("left({t}, {n})", t=out, n=sql.Literal(step.length))
    return out


_PAYLOADS = {
    PgForm.BOOL: "(CASE WHEN {x} THEN 't' ELSE 'f' END)",
    PgForm.BIT1: "(CASE WHEN {x} = B'1' THEN 't' ELSE 'f' END)",
    PgForm.INTEGER: "({x})::text",
    PgForm.NUMERIC: "({x})::text",
    PgForm.DATE: "(({x}) - DATE '1970-01-01')::text",
    PgForm.TIME_MS: "floor(extract(epoch FROM {x}) * 1000)::bigint::text",
    PgForm.TIME_NS: "((extract(epoch FROM {x}) * 1000000)::bigint * 1000)::text",
    PgForm.BYTEA_HEX: "encode({x}, 'hex')",
    PgForm.BYTEA_BASE64: "translate(encode({x}, 'base64'), E'\\n', '')",
    PgForm.BYTEA_BASE64_URL: "translate(encode({x}, 'base64'), E'+/\\n', '-_')",
    PgForm.HSTORE_JSON: (
        "('{{' || coalesce((SELECT string_agg(to_json(e.key)::text || ':' || "
        "coalesce(to_json(e.value)::text, 'null'), ',' ORDER BY e.n) "
        "FROM each({x}) WITH ORDINALITY AS e(key, value, n)), '') || '}}')"
    ),
}


def _scalar(x: sql.Composable, c: SourceColumn) -> sql.Composable:
    """The token of a non-NULL scalar value (an element, for arrays)."""
    form = c.form
    if form is PgForm.POINT:
        return _q("('S2:' || {a} || {b})", a=_v(_hex_float(_q("({x})[0]", x=x))),
                  b=_v(_hex_float(_q("({x})[1]", x=x))))  # fmt: skip
    if form is PgForm.HSTORE_MAP:
        return _q(
            "('M' || (SELECT count(*) FROM each({x})) || ':' || coalesce((SELECT string_agg("
            "{k} || CASE WHEN e.value IS NULL THEN 'N' ELSE {v} END, '' ORDER BY "
            "convert_to(e.key, 'UTF8')) FROM each({x}) AS e(key, value)), ''))",
            x=x, k=_v(sql.SQL("e.key")), v=_v(sql.SQL("e.value")),
        )  # fmt: skip
    if form is PgForm.TEXT:
        return _v(_text(x, c.steps))
    if form is PgForm.FLOAT:
        return _v(_hex_float(x))
    if form is PgForm.MONEY:  # round() rounds half away from zero, as silver's HALF_UP
        return _v(_q("round(({x})::numeric, {d})::text", x=x, d=sql.Literal(c.money_digits)))
    if form is PgForm.NUMERIC_FLOAT:
        return _v(_hex_float(_numeric_float8(_q("({x})::numeric", x=x))))
    if form in (PgForm.TIMESTAMP, PgForm.TIMESTAMPTZ, PgForm.TIME_US):
        return _v(_micros(x))
    if form is PgForm.INTERVAL_US:
        return _v(_q("({m})::bigint::text", m=_interval_micros(x)))
    return _v(_q(_PAYLOADS[form], x=x))


def _raw(x: sql.Composable, form: PgForm) -> sql.Composable:
    """Whether a non-NULL scalar of `form` is a value the silver type cannot hold."""
    templates = {
        PgForm.NUMERIC: "({x})::text IN ('NaN', 'Infinity', '-Infinity')",
        PgForm.DATE: "(NOT isfinite({x}) OR {x} < DATE '0001-01-01' OR {x} > DATE '9999-12-31')",
        PgForm.TIMESTAMP: "(NOT isfinite({x}) OR {x} < TIMESTAMP '0001-01-01' "
                          "OR {x} >= TIMESTAMP '10000-01-01')",
        PgForm.TIMESTAMPTZ: "(NOT isfinite({x}) OR {x} < TIMESTAMPTZ '0001-01-01 00:00:00+00' "
                            "OR {x} >= TIMESTAMPTZ '10000-01-01 00:00:00+00')",
    }  # fmt: skip
    if form is PgForm.INTERVAL_US:
        return _q("(NOT isfinite({x}) OR NOT ({m} BETWEEN -9223372036854775808 AND "
                  "9223372036854775807))", x=x, m=_interval_micros(x))  # fmt: skip
    return _q(templates[form], x=x)


def _is_null(x: sql.Composable, t: ColumnType) -> sql.Composed:
    # a composite whose fields are all NULL IS NULL in SQL, yet it is a value ('(,)')
    return _q("({x})::text IS NULL" if t.kind == "c" else "({x}) IS NULL", x=x)


def column_token(c: SourceColumn, x: sql.Composable | None = None) -> sql.Composed:
    """The token of column `c` (of expression `x`) per `cdc_core.validate_encoding`."""
    x = x if x is not None else sql.Identifier(c.name)
    raw_text = _q("concat({x})", x=x)
    raw = _q("('R' || length({t}) || ':' || {t})", t=raw_text)
    if c.type.array:
        e = sql.SQL("u.e")
        element = _q("CASE WHEN {null} THEN 'N' ELSE {tok} END", null=_is_null(e, c.type),
                     tok=_scalar(e, c))  # fmt: skip
        typed = _q("('A' || cardinality({x}) || ':' || coalesce((SELECT string_agg({el}, '' "
                   "ORDER BY u.n) FROM unnest({x}) WITH ORDINALITY AS u(e, n)), ''))",
                   x=x, el=element)  # fmt: skip
        shape = _q("coalesce(array_ndims({x}) > 1 OR array_lower({x}, 1) <> 1, false)", x=x)
        if c.form in RAW_FORMS:
            shape = _q("({s} OR EXISTS (SELECT 1 FROM unnest({x}) AS u(e) WHERE u.e IS NOT NULL "
                       "AND {r}))", s=shape, x=x, r=_raw(e, c.form))  # fmt: skip
        return _q("CASE WHEN {null} THEN 'N' WHEN {shape} THEN {raw} ELSE {typed} END",
                  null=_is_null(x, c.type), shape=shape, raw=raw, typed=typed)  # fmt: skip
    if c.form in RAW_FORMS:
        return _q("CASE WHEN {null} THEN 'N' WHEN {r} THEN {raw} ELSE {typed} END",
                  null=_is_null(x, c.type), r=_raw(x, c.form), raw=raw,
                  typed=_scalar(x, c))  # fmt: skip
    return _q("CASE WHEN {null} THEN 'N' ELSE {typed} END", null=_is_null(x, c.type),
              typed=_scalar(x, c))  # fmt: skip


def _h60(text: sql.Composable) -> sql.Composed:
    return _q("('x' || substr(md5({t}), 1, 15))::bit(60)::bigint", t=text)


def _concat(parts: Sequence[sql.Composable]) -> sql.Composable:
    return sql.SQL(" || ").join(parts) if parts else sql.Literal("")


class SourceTable:
    """One source table inside an open snapshot: a `Side` of the comparison."""

    def __init__(
        self, conn: Conn, table: TableName, columns: Sequence[SourceColumn], key: Sequence[str],
        *, select: str | None = None,
    ) -> None:  # fmt: skip
        """`select`: the rows are those this SELECT returns, not the table's."""
        self.conn = conn
        self.name: sql.Composable = (
            sql.SQL("({}) AS cdc_selected").format(sql.SQL(select))
            if select
            else own_rows(conn, table)
        )
        self.columns = tuple(columns)
        self.key = tuple(key)
        at = {c.name: i for i, c in enumerate(self.columns)}
        tokens = [sql.SQL("c.{}").format(sql.Identifier(f"t{i}")) for i in range(len(columns))]
        self._row = _concat(tokens)
        self._key = _concat([tokens[at[k]] for k in self.key]) if self.key else self._row
        self._hashes = sql.SQL("ARRAY[{}]::bigint[]").format(
            sql.SQL(", ").join(_h60(t) for t in tokens)
        )
        shown = [sql.Identifier(k) for k in self.key] or [sql.Identifier(c.name) for c in columns]
        self._shown = sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(
            _q("left(concat({x}), {n})", x=x, n=sql.Literal(SHOWN_CHARS)) for x in shown
        ))  # fmt: skip
        self._tokens = sql.SQL(", ").join(
            _q("{tok} AS {name}", tok=column_token(c), name=sql.Identifier(f"t{i}"))
            for i, c in enumerate(self.columns)
        )

    def _digests(self, *, detail: bool = False) -> sql.Composed:
        """kh, rh (and with `detail` kt, shown, column hashes) of every row. OFFSET 0 keeps
        the planner from inlining the tokens, so each is computed once."""
        outer: sql.Composable
        inner: sql.Composable
        if detail:
            outer = _q(", {kt} AS kt, c.shown, {cols} AS cols", kt=self._key, cols=self._hashes)
            inner = _q(", {shown} AS shown", shown=self._shown)
        else:
            outer = inner = sql.SQL("")
        return _q(
            "SELECT {kh} AS kh, {rh} AS rh{outer} FROM (SELECT {tokens}{inner} FROM {table} "
            "OFFSET 0) AS c",
            kh=_h60(self._key), rh=_h60(self._row), outer=outer, tokens=self._tokens,
            inner=inner, table=self.name,
        )  # fmt: skip

    def count(self) -> int:
        row = self.conn.execute(_q("SELECT count(*) FROM {t}", t=self.name)).fetchone()
        return _int(row[0]) if row else 0

    def buckets(self, depth: int, within: Ranges | None) -> dict[int, Bucket]:
        query = _q(
            "SELECT d.kh >> {shift} AS b, count(*), sum(d.rh) FROM ({rows}) AS d{where} GROUP BY 1",
            shift=sql.Literal(60 - depth), rows=self._digests(), where=_within(within),
        )  # fmt: skip
        return {_int(b): Bucket(_int(n), _int(s)) for b, n, s in self.conn.execute(query)}

    def rows(self, within: Ranges) -> list[RowDigest]:
        return self._fetch(_within(within))

    def rows_for(self, key_hashes: Sequence[int]) -> list[RowDigest]:
        return self._fetch(_q(" WHERE d.kh = ANY({h}::bigint[])", h=sql.Literal(list(key_hashes))))

    def _fetch(self, where: sql.Composable) -> list[RowDigest]:
        rows = self._digests(detail=True)
        if self.key:
            query = _q("SELECT d.kh, d.kt, d.shown, d.rh, d.cols, 1 FROM ({rows}) AS d{where}",
                       rows=rows, where=where)  # fmt: skip
        else:  # a multiset: one digest per distinct row, with how many copies
            query = _q(
                "SELECT DISTINCT ON (d.rh) d.kh, '', d.shown, d.rh, d.cols, "
                "count(*) OVER (PARTITION BY d.rh) FROM ({rows}) AS d{where}",
                rows=rows, where=where,
            )  # fmt: skip
        return [
            RowDigest(
                _int(kh),
                str(kt),
                tuple(_list(shown)),
                _int(rh),
                tuple(_int(h) for h in _list(cols)),
                _int(n),
            )
            for kh, kt, shown, rh, cols, n in self.conn.execute(query)
        ]


def _int(value: object) -> int:
    """An integer the server sent (int, or Decimal for sums)."""
    if not isinstance(value, int | Decimal):
        raise TypeError(f"expected an integer from the server, got {value!r}")
    return int(value)


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected an array from the server, got {value!r}")
    return value


def _within(within: Ranges | None) -> sql.Composable:
    """The condition for rows in `within` (values inlined: no placeholders, so no % escaping)."""
    if within is None:
        return sql.SQL("")
    return _q(" WHERE d.kh >> {shift} = ANY({ids}::bigint[])", shift=sql.Literal(within.shift),
              ids=sql.Literal(list(within.ids)))  # fmt: skip


def describe_source(conn: Conn, table: TableName) -> RelationDescriptor | None:
    """The table's columns and types as the catalog has them in the snapshot; None when the
    table does not exist (a savepoint keeps the snapshot's transaction usable)."""
    try:
        with conn.transaction():
            return catalog_descriptor(conn, table)
    except psycopg.errors.UndefinedTable:
        return None


def count_rows(conn: Conn, table: TableName) -> int:
    row = conn.execute(_q("SELECT count(*) FROM {t}", t=own_rows(conn, table)))
    found = row.fetchone()
    return _int(found[0]) if found else 0


_UNCAPTURED = """
SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL,
    'proto_version', '1', 'publication_names', %s)
WHERE (get_byte(data, 0) IN (73, 85, 68) AND substring(data FROM 2 FOR 4) = int4send(%s::int))
   OR get_byte(data, 0) = 84
"""
"""Insert (I), Update (U) and Delete (D) messages of one relation, and every Truncate (T)."""


def uncaptured_changes(
    dsn: Dsn, slot: str, publication: str, table_oid: int, upto: Lsn
) -> int | None:
    """Changes of a table in the WAL the slot has not confirmed yet, up to `upto` (a snapshot's
    position): a peek, bounded by `upto`, that moves nothing. None when the slot is in use (an
    ingest is reading it: it is never taken from a running pipeline) or missing."""
    name = publication_names(publication)
    try:
        with connect(dsn, bounded=False) as conn:  # cdc validate's reads are as big as the data
            row = conn.execute(_UNCAPTURED, (slot, str(upto), name, table_oid)).fetchone()
    except (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
        return None
    return _int(row[0]) if row else 0


@contextmanager
def source_snapshot(dsn: Dsn, slot: str) -> Iterator[tuple[Conn, Snapshot]]:
    """A REPEATABLE READ, READ ONLY transaction with the product's value settings, and where
    its snapshot stands; the transaction ends (rolled back: it wrote nothing) on exit."""
    conn = connect(dsn, autocommit=False, values=True, bounded=False)  # whole tables
    try:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        row = conn.execute(_POSITIONS, (slot,)).fetchone()  # takes the snapshot
        assert row is not None
        confirmed = Lsn.parse(str(row[1])) if row[1] is not None else None
        yield conn, Snapshot(Lsn.parse(str(row[0])), confirmed)
    finally:
        conn.rollback()
        conn.close()
