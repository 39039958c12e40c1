"""Snapshot chunk planning (pure predicates): a table cut into key or block ranges of even size."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, tuple_row

from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.pg import catalog
from cdc_core.pg.connect import VALUE_SETTINGS, unbounded

Bound = tuple[str | None, ...] | None

SMALL_TABLE_PAGES = 10_000
"""Below this many pages (80 MB) the row estimate is an exact count(*)."""
EXACT_ROWS_LIMIT = 2_000_000
"""Up to this many rows, non-integer keys get exact boundaries from one ordered pass."""
SAMPLES_PER_CHUNK = 100
"""Above EXACT_ROWS_LIMIT, sampled rows per chunk (chunk sizes vary by about 1/sqrt of it)."""
SAMPLE_SEED = 20_240_317
"""TABLESAMPLE ... REPEATABLE seed: the same table state plans the same chunks."""
MAX_KEY_SPREAD = 10
"""Integer keys are cut into even key ranges only while max - min < this x rows; a sparser or
skewed key space (a sentinel id, ids from a shared sequence) is sampled like any other key."""

_INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})


@dataclass(frozen=True)
class Chunk:
    """One chunk: the rows with lower <= key < upper; None on a side means unbounded there."""

    number: int
    lower: Bound
    """Inclusive lower bound, key values as PostgreSQL text; for ctid plans (block number,)."""
    upper: Bound
    """Exclusive upper bound, in the same form."""

    def to_json(self) -> dict[str, object]:
        return {"number": self.number, "lower": _listed(self.lower), "upper": _listed(self.upper)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Chunk:
        number = data.get("number")
        if not isinstance(number, int) or isinstance(number, bool):
            raise ValueError(f"chunk number must be an integer, not {number!r}")
        return cls(number, _bound(data.get("lower")), _bound(data.get("upper")))


@dataclass(frozen=True)
class ChunkPlan:
    """A table's snapshot cut into chunks that hold every row exactly once, in key order."""

    table: TableName
    key: tuple[str, ...]
    """The chunk key columns in order; () means ctid (block) ranges for a table without a key."""
    key_types: tuple[str, ...]
    """format_type() of each key column (schema-qualified outside pg_catalog): literal casts."""
    chunks: tuple[Chunk, ...]
    estimated_rows: int
    nullable: tuple[str, ...] = ()
    """Key columns that may be NULL (a given key lacking NOT NULL): their NULL rows are last."""

    def __post_init__(self) -> None:
        problems = _plan_problems(self)
        if problems:
            raise ValueError(f"chunk plan of {self.table} needs {', '.join(problems)}")

    def to_json(self) -> dict[str, object]:
        return {
            "table": {"schema": self.table.schema, "name": self.table.name},
            "key": list(self.key),
            "key_types": list(self.key_types),
            "nullable": list(self.nullable),
            "estimated_rows": self.estimated_rows,
            "chunks": [c.to_json() for c in self.chunks],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ChunkPlan:
        table, chunks, rows = data.get("table"), data.get("chunks"), data.get("estimated_rows")
        if not isinstance(table, Mapping) or not all(
            isinstance(table.get(k), str) for k in ("schema", "name")
        ):
            raise ValueError(f"chunk plan table must be {{schema, name}}, not {table!r}")
        if not isinstance(chunks, list) or not all(isinstance(c, Mapping) for c in chunks):
            raise ValueError(f"chunk plan chunks must be a list of objects, not {chunks!r}")
        if not isinstance(rows, int) or isinstance(rows, bool):
            raise ValueError(f"chunk plan estimated_rows must be an integer, not {rows!r}")
        return cls(
            table=TableName(table["schema"], table["name"]),
            key=_strings(data.get("key"), "key"),
            key_types=_strings(data.get("key_types"), "key_types"),
            chunks=tuple(Chunk.from_json(c) for c in chunks),
            estimated_rows=rows,
            nullable=_strings(data.get("nullable", []), "nullable"),
        )


def _plan_problems(plan: ChunkPlan) -> list[str]:
    """What keeps the chunks from holding every row exactly once (bounds are not compared)."""
    chunks, width = plan.chunks, len(plan.key) or 1
    problems = []
    if len(plan.key_types) != len(plan.key):
        problems.append("one type per key column")
    if not set(plan.nullable) <= set(plan.key):
        problems.append("nullable columns among the key")
    if not chunks or (chunks[0].lower, chunks[-1].upper) != (None, None):
        problems.append("a first chunk unbounded below and a last unbounded above")
    if any(c.number != i for i, c in enumerate(chunks)):
        problems.append("chunks numbered 0, 1, ...")
    if any(a.upper != b.lower or a.upper is None for a, b in itertools.pairwise(chunks)):
        problems.append("each chunk to start where the one before ends")
    if any(len(b) != width for c in chunks for b in (c.lower, c.upper) if b is not None):
        problems.append(f"bounds of {width} value(s)")
    return problems


def _listed(bound: Bound) -> list[str | None] | None:
    return None if bound is None else list(bound)


def _bound(value: object) -> Bound:
    if value is None:
        return None
    if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
        raise ValueError(f"chunk bound must be null or a list of strings, not {value!r}")
    return tuple(value)


def _strings(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"chunk plan {field} must be a list of strings, not {value!r}")
    return tuple(value)


# --- rendering: pure, runs on the driver to build each chunk's SQL for JDBC ---


def chunk_predicate(plan: ChunkPlan, chunk: Chunk) -> str:
    """The SQL condition selecting the chunk's rows, e.g. `"id" >= '100'::bigint AND "id" <
    '200'::bigint`; 'TRUE' for a chunk unbounded on both sides. Key columns are never cast, so
    the comparison uses the column's index and collation, as the planning ORDER BY did."""
    if not plan.key:
        sides = [
            f"ctid {op} '({int(bound[0] or 0)},0)'::tid"
            for op, bound in ((">=", chunk.lower), ("<", chunk.upper))
            if bound is not None
        ]
        return " AND ".join(sides) or "TRUE"
    column = ", ".join(_identifier(k) for k in plan.key)
    left = f"({column})" if len(plan.key) > 1 else column
    sides = [
        f"{left} {op} {_values(bound, plan.key_types)}"
        for op, bound in ((">=", chunk.lower), ("<", chunk.upper))
        if bound is not None
    ]
    if plan.nullable and chunk.upper is None and sides:
        # Row comparisons with a NULL are NULL, so no bounded chunk holds such rows: the last does.
        is_null = " OR ".join(f"{_identifier(c)} IS NULL" for c in plan.nullable)
        return f"({sides[0]} OR {is_null})"
    if plan.nullable and sides:
        # A composite comparison can be decided before reaching the NULL: keep those rows out.
        sides += [f"{_identifier(c)} IS NOT NULL" for c in plan.nullable]
    return " AND ".join(sides) or "TRUE"


def _values(bound: tuple[str | None, ...], types: Sequence[str]) -> str:
    values = [
        f"{'NULL' if v is None else _literal(v)}::{t}" for v, t in zip(bound, types, strict=True)
    ]
    return f"({', '.join(values)})" if len(values) > 1 else values[0]


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    """quote_literal(): E'' with doubled backslashes when there are any, whatever the server's
    standard_conforming_strings is."""
    quoted = "'" + value.replace("'", "''") + "'"
    return "E" + quoted.replace("\\", "\\\\") if "\\" in value else quoted


# --- planning: reads the catalog and the table ---


@dataclass(frozen=True)
class _KeyColumn:
    name: str
    type_name: str
    not_null: bool


def plan_chunks(
    conn: psycopg.Connection[Any],
    table: TableName,
    *,
    key: Sequence[str] | None = None,
    chunk_size: int = 100_000,
) -> ChunkPlan:
    """key=None: the table's primary key, or ctid ranges when it has none; a given key (Debezium's
    surrogate-key) is used as is. Non-integer keys are read as text: `conn` must be a session
    from `connect(values=True)`, so that the text casts back to the same value anywhere."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
    with unbounded(conn):  # a big table's sample or count scans it: as long as it is big
        return _plan(conn, table, key, chunk_size)


def _plan(
    conn: psycopg.Connection[Any], table: TableName, key: Sequence[str] | None, chunk_size: int
) -> ChunkPlan:
    info = catalog.table_info(conn, [table])[table]
    if info is None:
        raise TerminalError(f"cannot plan a snapshot of {table}: no such table")
    columns = _key_columns(conn, info.oid, table, tuple(info.primary_key if key is None else key))
    rows, pages = _estimate(conn, table, info.oid)
    wanted = max(1, math.ceil(rows / chunk_size))
    bounds: list[tuple[str, ...]] = []
    if not columns:
        bounds = _even_cuts(0, pages, wanted)
    elif wanted > 1 and len(columns) == 1 and columns[0].type_name in _INTEGER_TYPES:
        bounds = _integer_bounds(conn, table, columns[0].name, rows, wanted)
    if columns and wanted > 1 and not bounds:
        bounds = _sampled_bounds(conn, table, columns, rows, chunk_size)
    edges: list[Bound] = [None, *bounds, None]
    return ChunkPlan(
        table=table,
        key=tuple(c.name for c in columns),
        key_types=tuple(c.type_name for c in columns),
        chunks=tuple(Chunk(i, edges[i], edges[i + 1]) for i in range(len(edges) - 1)),
        estimated_rows=rows,
        nullable=tuple(c.name for c in columns if not c.not_null),
    )


def _rows(
    conn: psycopg.Connection[Any],
    query: str | sql.SQL | sql.Composed,
    params: Sequence[object] = (),
) -> list[TupleRow]:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query, params or None)
        return cur.fetchall()


_KEY_COLUMNS = """
SELECT k.name, a.attname,
       CASE WHEN t.typnamespace = 'pg_catalog'::regnamespace
            THEN format_type(a.atttypid, a.atttypmod)
            ELSE quote_ident(n.nspname) || '.' || quote_ident(t.typname) END,
       a.attnotnull
FROM unnest(%s::text[]) WITH ORDINALITY AS k(name, ord)
LEFT JOIN pg_attribute a ON a.attrelid = %s AND a.attname = k.name
                        AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_namespace n ON n.oid = t.typnamespace
ORDER BY k.ord
"""


def _key_columns(
    conn: psycopg.Connection[Any], oid: int, table: TableName, names: tuple[str, ...]
) -> tuple[_KeyColumn, ...]:
    """The key's columns with their types; the type is qualified unless it is a built-in one,
    so the literal casts resolve whatever the reading session's search_path is."""
    rows = _rows(conn, _KEY_COLUMNS, (list(names), oid))
    missing = [str(name) for name, found, *_ in rows if found is None]
    if missing or len(set(names)) != len(names):
        raise TerminalError(
            f"cannot plan a snapshot of {table} by key {', '.join(names)}: "
            + (f"no column {', '.join(missing)}" if missing else "a column is named twice")
        )
    return tuple(_KeyColumn(str(name), str(type_name), bool(nn)) for _, name, type_name, nn in rows)


_ESTIMATE = """
SELECT coalesce(sum(pages), 0)::bigint, coalesce(max(pages), 0)::bigint,
       sum(CASE WHEN pages = 0 THEN 0 ELSE reltuples / nullif(relpages, 0) * pages END),
       coalesce(bool_and(pages = 0 OR (relpages > 0 AND reltuples >= 0)), false)
FROM (SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
             c.relpages, c.reltuples
      FROM pg_class c
      WHERE c.relkind <> 'p' AND c.oid IN (SELECT %s::oid UNION
                                          SELECT relid FROM pg_partition_tree(%s::oid::regclass)
                                          WHERE isleaf)) leaves
"""


def _estimate(conn: psycopg.Connection[Any], table: TableName, oid: int) -> tuple[int, int]:
    """(rows, pages of the largest leaf): an exact count for small tables; else the statistics'
    row density times the current size (as the planner estimates), counting when never analyzed.
    Leaves of a partitioned table number their blocks each, so ctid ranges cut the largest one."""
    ((pages, largest, density_rows, analyzed),) = _rows(conn, _ESTIMATE, (oid, oid))
    if int(pages) < SMALL_TABLE_PAGES or not analyzed:
        query = sql.SQL("SELECT count(*) FROM {}").format(catalog.own_rows(conn, table))
        ((count,),) = _rows(conn, query)
        return int(count), int(largest)
    return round(float(density_rows)), int(largest)


def _even_cuts(low: int, span: int, parts: int) -> list[tuple[str, ...]]:
    """Strictly increasing cut points splitting [low, low + span) into min(parts, span) ranges."""
    parts = max(1, min(parts, span))
    return [(str(low + span * i // parts),) for i in range(1, parts)]


def _integer_bounds(
    conn: psycopg.Connection[Any], table: TableName, column: str, rows: int, wanted: int
) -> list[tuple[str, ...]]:
    """Even ranges of the key space from min and max (an index read, no sort); [] when the
    key space is too sparse for even ranges to hold even row counts."""
    query = sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(
        sql.Identifier(column), catalog.own_rows(conn, table)
    )
    ((low, high),) = _rows(conn, query)
    if low is None:
        return []
    span = int(high) - int(low) + 1
    if span > MAX_KEY_SPREAD * rows:
        return []
    return _even_cuts(int(low), span, wanted)


def _sampled_bounds(
    conn: psycopg.Connection[Any],
    table: TableName,
    columns: Sequence[_KeyColumn],
    rows: int,
    chunk_size: int,
) -> list[tuple[str, ...]]:
    """Every step-th key in key order, as the type's output text: over all rows (exact) or,
    for large tables, over a Bernoulli sample of SAMPLES_PER_CHUNK rows per chunk."""
    _require_value_session(conn)
    step, sample = _sampling(rows, chunk_size)
    names = [sql.Identifier(c.name) for c in columns]
    not_null = [
        sql.SQL("{} IS NOT NULL").format(sql.Identifier(c.name)) for c in columns if not c.not_null
    ]
    query = sql.SQL(
        "SELECT {texts} FROM (SELECT {keys}, row_number() OVER (ORDER BY {keys}) AS cdc_rn "
        "FROM {table} {sample} WHERE {not_null}) s "
        "WHERE cdc_rn % {step} = 1 AND cdc_rn > 1 ORDER BY cdc_rn"
    ).format(
        texts=sql.SQL(", ").join(sql.SQL("format('%s', {})").format(n) for n in names),
        keys=sql.SQL(", ").join(names),
        table=catalog.own_rows(conn, table),
        sample=sample,
        not_null=sql.SQL(" AND ").join([sql.SQL("TRUE"), *not_null]),
        step=sql.Literal(step),
    )
    bounds: list[tuple[str, ...]] = []
    for row in _rows(conn, query):
        bound = tuple(str(v) for v in row)
        if not bounds or bounds[-1] != bound:  # a key that is not unique repeats a boundary
            bounds.append(bound)
    return bounds


def _sampling(rows: int, chunk_size: int) -> tuple[int, sql.Composable]:
    """(every how many rows a boundary is taken, the TABLESAMPLE clause or nothing).

    Bernoulli, not SYSTEM: SYSTEM samples whole pages, and where rows sit in key order (serial
    keys) a page is one cluster of neighbouring keys, so chunks came out up to 9x too large."""
    if rows <= EXACT_ROWS_LIMIT or chunk_size <= SAMPLES_PER_CHUNK:
        return chunk_size, sql.SQL("")
    percent = 100 * SAMPLES_PER_CHUNK / chunk_size
    clause = sql.SQL("TABLESAMPLE BERNOULLI ({}) REPEATABLE ({})")
    return SAMPLES_PER_CHUNK, clause.format(sql.Literal(percent), sql.Literal(SAMPLE_SEED))


def _require_value_session(conn: psycopg.Connection[Any]) -> None:
    """Key values read as text must cast back to the same value in the reading session."""
    query = "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS s(name)"
    current = {str(name): str(value) for name, value in _rows(conn, query, (list(VALUE_SETTINGS),))}
    wrong = [  # DateStyle reads back as 'ISO, MDY': the field order does not change ISO output
        f"{name} is {current[name]!r}, not {want!r}"
        for name, want in VALUE_SETTINGS.items()
        if current[name].split(",")[0].strip() != want
    ]
    if wrong:
        raise ValueError(
            "planning chunks reads key values as text and needs a session from "
            f"connect(values=True): {'; '.join(wrong)}"
        )
