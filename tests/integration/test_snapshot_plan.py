"""Chunk plans against a real PostgreSQL: every row in exactly one chunk, chunks of even size.

Each table is planned with a small chunk size, then every chunk is counted twice: in a session
like the planner's and in one whose settings differ in every way that could change how a literal
reads (DateStyle, TimeZone, standard_conforming_strings, search_path). Same counts in both, and
their sum the table's count, means no row is missed or read twice wherever the chunks are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from cdc_core import snapshot_plan
from cdc_core.config import Dsn
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.pg.connect import connect
from cdc_core.snapshot_plan import ChunkPlan, chunk_predicate, plan_chunks
from tests.integration.conftest import PgServer

T = TableName("public", "t")
HOSTILE_SESSION = [
    "SET DateStyle = 'SQL, DMY'",
    "SET TimeZone = 'Asia/Kolkata'",
    "SET IntervalStyle = 'sql_standard'",
    "SET standard_conforming_strings = off",
    "SET extra_float_digits = 0",
    "SET search_path = ''",
]


@dataclass(frozen=True)
class Source:
    """A database to plan in: the planner's session and a hostile reader's."""

    planner: psycopg.Connection[tuple[object, ...]]
    hostile: psycopg.Connection[tuple[object, ...]]

    def run(self, *statements: str) -> None:
        for s in statements:
            self.planner.execute(s)

    def count(self, table: TableName, where: str = "TRUE", *, hostile: bool = False) -> int:
        conn = self.hostile if hostile else self.planner
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()
        assert row is not None
        return int(str(row[0]))

    def chunk_counts(self, plan: ChunkPlan) -> list[int]:
        """Rows per chunk; asserts that the hostile session sees the same."""
        counts = [self.count(plan.table, chunk_predicate(plan, c)) for c in plan.chunks]
        hostile = [
            self.count(plan.table, chunk_predicate(plan, c), hostile=True) for c in plan.chunks
        ]
        assert hostile == counts, "a literal reads differently in another session"
        return counts

    def first_rows(self, plan: ChunkPlan, *, hostile: bool = False) -> list[tuple[str, ...]]:
        """Each chunk's first row in key order, after the first chunk: (tableoid, ctid, *key text)."""
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in plan.key)
        texts = sql.SQL(", ").join(
            sql.SQL("format('%s', {})").format(sql.Identifier(k)) for k in plan.key
        )
        out = []
        for chunk in plan.chunks[1:]:
            query = sql.SQL("SELECT tableoid::int, ctid, {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
                texts, sql.Identifier(plan.table.schema, plan.table.name),
                sql.SQL(chunk_predicate(plan, chunk)), keys,
            )  # fmt: skip
            row = (self.hostile if hostile else self.planner).execute(query).fetchone()
            out.append(tuple(str(v) for v in row or ()))
        return out


@pytest.fixture
def source(pg: PgServer, database: str) -> Iterator[Source]:
    planner = connect(Dsn(pg.dsn(database)), values=True)
    hostile = psycopg.connect(pg.dsn(database), autocommit=True)
    for s in HOSTILE_SESSION:
        hostile.execute(s)
    yield Source(planner, hostile)
    planner.close()
    hostile.close()


def assert_every_row_in_one_chunk(source: Source, plan: ChunkPlan) -> list[int]:
    counts = source.chunk_counts(plan)
    assert sum(counts) == source.count(plan.table), counts
    return counts


TEXTS = r"""CASE g % 6 WHEN 0 THEN 'Zoë 東京 🎉 ' WHEN 1 THEN 'it''s ' WHEN 2 THEN 'a\b\\c ' WHEN 3 THEN ''
           WHEN 4 THEN '"q" ' ELSE 'ß' END || md5(g::text) || CASE WHEN g % 5 = 0 THEN '  ' ELSE '' END"""


@dataclass(frozen=True)
class Case:
    ddl: tuple[str, ...]
    key: tuple[str, ...] | None = None
    even: bool = True
    """Boundaries are keys of the table; chunks hold chunk_size rows (exact), or 90-100% of it
    (dense integer key ranges), the last one less."""


CASES = {
    "bigint dense": Case(("CREATE TABLE t (id bigint PRIMARY KEY)",
                          "INSERT INTO t SELECT g FROM generate_series(1, 20000) g")),
    "bigint sparse, sampled": Case(("CREATE TABLE t (id bigint PRIMARY KEY)",
                                    "INSERT INTO t SELECT g FROM generate_series(1, 10000) g",
                                    "INSERT INTO t SELECT 1e15 + g FROM generate_series(1, 5000) g")),
    "bigint skewed, by range": Case(("CREATE TABLE t (id bigint PRIMARY KEY)",
                                     "INSERT INTO t SELECT g FROM generate_series(1, 9000) g",
                                     "INSERT INTO t SELECT g FROM generate_series(9001, 50000, 41) g"),
                                    even=False),
    "smallint negative": Case(("CREATE TABLE t (id smallint PRIMARY KEY)",
                               "INSERT INTO t SELECT g FROM generate_series(-15000, 15000) g")),
    "text": Case(("CREATE TABLE t (k text PRIMARY KEY)",
                  f"INSERT INTO t SELECT {TEXTS} FROM generate_series(1, 20000) g")),
    "text in a linguistic collation": Case((
        'CREATE TABLE t (k text COLLATE "en-US-x-icu" PRIMARY KEY)',
        f"INSERT INTO t SELECT {TEXTS} FROM generate_series(1, 20000) g")),
    "char(n) with padding": Case(("CREATE TABLE t (k char(12) PRIMARY KEY)",
                                  "INSERT INTO t SELECT 'k''' || g FROM generate_series(1, 20000) g")),
    "varchar with trailing spaces": Case((
        "CREATE TABLE t (k varchar(40) PRIMARY KEY)",
        "INSERT INTO t SELECT rpad(g::text, 5 + g % 7) FROM generate_series(1, 20000) g")),
    "uuid": Case(("CREATE TABLE t (k uuid PRIMARY KEY)",
                  "INSERT INTO t SELECT md5(g::text)::uuid FROM generate_series(1, 20000) g")),
    "numeric": Case(("CREATE TABLE t (k numeric PRIMARY KEY)",
                     "INSERT INTO t SELECT (g - 10000) * 1.25 + 0.000001 * (g % 7) "
                     "FROM generate_series(1, 20000) g")),
    "double precision": Case(("CREATE TABLE t (k double precision PRIMARY KEY)",
                              "INSERT INTO t SELECT g * 0.1 FROM generate_series(1, 20000) g")),
    "timestamptz": Case(("CREATE TABLE t (k timestamptz PRIMARY KEY)",
                         "INSERT INTO t SELECT '2024-03-31 01:59:59.5+01'::timestamptz "
                         "+ g * interval '1 hour 7 microseconds' FROM generate_series(1, 20000) g")),
    "composite (text, int)": Case(("CREATE TABLE t (a text, b int, PRIMARY KEY (a, b))",
                                   "INSERT INTO t SELECT md5((g % 100)::text), g "
                                   "FROM generate_series(1, 20000) g")),
    "composite (enum in another schema, int)": Case((
        'CREATE SCHEMA "My Schema"',
        """CREATE TYPE "My Schema".mood AS ENUM ('sad', 'ok', 'happy')""",
        'CREATE TABLE t (m "My Schema".mood, n int, PRIMARY KEY (m, n))',
        "INSERT INTO t SELECT (enum_range(NULL::\"My Schema\".mood))[1 + g % 3], g "
        "FROM generate_series(1, 20000) g")),
    "partitioned, by key": Case((
        "CREATE TABLE t (id int PRIMARY KEY) PARTITION BY RANGE (id)",
        "CREATE TABLE t_1 PARTITION OF t FOR VALUES FROM (MINVALUE) TO (7000)",
        "CREATE TABLE t_2 PARTITION OF t FOR VALUES FROM (7000) TO (MAXVALUE)",
        "INSERT INTO t SELECT g FROM generate_series(1, 20000) g")),
    "no primary key: blocks": Case(("CREATE TABLE t (v text)",
                                    "INSERT INTO t SELECT md5(g::text) FROM generate_series(1, 20000) g"),
                                   even=False),
    "no primary key, partitioned: blocks": Case((
        "CREATE TABLE t (id int, v text) PARTITION BY LIST (id)",
        "CREATE TABLE t_odd PARTITION OF t FOR VALUES IN (1)",
        "CREATE TABLE t_even PARTITION OF t FOR VALUES IN (0)",
        "INSERT INTO t SELECT g % 2, md5(g::text) FROM generate_series(1, 20000) g"), even=False),
    "nullable surrogate key": Case((
        "CREATE TABLE t (a text, b int)",
        "INSERT INTO t SELECT CASE WHEN g % 10 <> 0 THEN md5((g % 50)::text) END, "
        "CASE WHEN g % 7 <> 0 THEN g END FROM generate_series(1, 20000) g"),
        key=("a", "b"), even=False),
    "surrogate key, not unique and not indexed": Case((
        "CREATE TABLE t (id bigint PRIMARY KEY, k text NOT NULL)",
        "INSERT INTO t SELECT g, md5((g / 3)::text) FROM generate_series(1, 20000) g"),
        key=("k",), even=False),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_row_falls_in_exactly_one_chunk(source: Source, case: Case) -> None:
    source.run(*case.ddl)
    plan = plan_chunks(source.planner, T, key=case.key, chunk_size=1000)
    counts = assert_every_row_in_one_chunk(source, plan)
    assert len(plan.chunks) >= 10
    if case.even:
        assert max(counts) <= 1000, counts
        assert min(counts[:-1]) >= 900, counts
        first = source.first_rows(plan)
        assert [row[2:] for row in first] == [c.lower for c in plan.chunks[1:]]
        assert [row[:2] for row in source.first_rows(plan, hostile=True)] == [r[:2] for r in first]


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        ("CREATE TABLE t (id bigint PRIMARY KEY)", 0),
        ("CREATE TABLE t (k text PRIMARY KEY); INSERT INTO t VALUES ('only')", 1),
        ("CREATE TABLE t (v text)", 0),
        ("CREATE TABLE t (v text); INSERT INTO t VALUES ('only')", 1),
    ],
)
def test_an_empty_or_one_row_table_is_one_chunk_selecting_everything(
    source: Source, ddl: str, expected: int
) -> None:
    source.run(ddl)
    plan = plan_chunks(source.planner, T, chunk_size=1000)
    assert [chunk_predicate(plan, c) for c in plan.chunks] == ["TRUE"]
    assert plan.estimated_rows == expected
    assert source.chunk_counts(plan) == [expected]


def test_a_table_with_capitals_spaces_and_quotes_in_its_names_is_planned(source: Source) -> None:
    table = TableName("Sales Team", 'x"; DROP TABLE y; --')
    name = sql.Identifier(table.schema, table.name).as_string(source.planner)
    source.run(
        'CREATE SCHEMA "Sales Team"',
        f'CREATE TABLE {name} ("Key ""K""" text PRIMARY KEY, "Order" int)',
        f"INSERT INTO {name} SELECT md5(g::text) || '''', g FROM generate_series(1, 5000) g",
    )
    plan = plan_chunks(source.planner, table, chunk_size=1000)
    assert plan.key == ('Key "K"',)
    assert assert_every_row_in_one_chunk(source, plan) == [1000] * 5
    by_order = plan_chunks(source.planner, table, key=["Order"], chunk_size=1000)
    assert assert_every_row_in_one_chunk(source, by_order) == [1000] * 5


@pytest.mark.parametrize(
    ("ddl", "key"),
    [
        ("CREATE TABLE t (k text PRIMARY KEY)", None),
        ("CREATE TABLE t (id bigint PRIMARY KEY)", ("id",)),
    ],
    ids=["text", "sparse bigint"],
)
def test_sampled_boundaries_keep_chunks_within_half_to_one_and_a_half_chunk_sizes(
    source: Source, monkeypatch: pytest.MonkeyPatch, ddl: str, key: tuple[str, ...] | None
) -> None:
    monkeypatch.setattr(snapshot_plan, "EXACT_ROWS_LIMIT", 0)  # sample as for a large table
    source.run(
        ddl,
        f"INSERT INTO t SELECT {TEXTS if key is None else 'g::bigint * g'} FROM generate_series(1, 50000) g",
    )
    plan = plan_chunks(source.planner, T, key=key, chunk_size=1000)
    counts = assert_every_row_in_one_chunk(source, plan)
    assert 40 <= len(counts) <= 60
    assert max(counts) <= 1500, counts
    assert min(counts[:-1]) >= 500, counts


def test_a_dense_integer_key_is_cut_into_even_key_ranges(source: Source) -> None:
    source.run(
        "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t SELECT generate_series(1, 3000)"
    )
    plan = plan_chunks(source.planner, T, chunk_size=1000)
    assert [(c.lower, c.upper) for c in plan.chunks] == [
        (None, ("1001",)), (("1001",), ("2001",)), (("2001",), None)
    ]  # fmt: skip
    assert plan.key_types == ("integer",)


def test_a_table_without_a_key_is_cut_into_block_ranges(source: Source) -> None:
    source.run(
        "CREATE TABLE t (v text)",
        "INSERT INTO t SELECT md5(g::text) FROM generate_series(1, 5000) g",
    )
    pages = source.planner.execute("SELECT pg_relation_size('t') / 8192").fetchone()
    plan = plan_chunks(source.planner, T, chunk_size=1000)
    assert (plan.key, len(plan.chunks), pages) == ((), 5, (42,))
    assert [c.lower for c in plan.chunks] == [None, ("8",), ("16",), ("25",), ("33",)]
    explain = f"EXPLAIN SELECT * FROM t WHERE {chunk_predicate(plan, plan.chunks[1])}"
    assert "Tid Range Scan" in str(source.planner.execute(explain).fetchall())


def test_the_statistics_estimate_large_tables_and_a_count_stands_in_until_analyze(
    source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_plan, "SMALL_TABLE_PAGES", 0)  # every table counts as large
    source.run(
        "CREATE TABLE t (v text)",
        "INSERT INTO t SELECT md5(g::text) FROM generate_series(1, 5000) g",
    )
    assert plan_chunks(source.planner, T).estimated_rows == 5000
    source.run("ANALYZE t", "INSERT INTO t SELECT md5(g::text) FROM generate_series(1, 5000) g")
    assert 9000 <= plan_chunks(source.planner, T).estimated_rows <= 11000  # density x pages now


def test_a_given_key_with_a_missing_column_is_refused_by_name(source: Source) -> None:
    source.run("CREATE TABLE t (id bigint PRIMARY KEY)")
    with pytest.raises(TerminalError, match="by key id, nope: no column nope"):
        plan_chunks(source.planner, T, key=["id", "nope"])


def test_a_missing_table_is_refused(source: Source) -> None:
    with pytest.raises(TerminalError, match=r"public\.missing: no such table"):
        plan_chunks(source.planner, TableName("public", "missing"))


def test_text_boundaries_need_a_session_with_deterministic_value_text(source: Source) -> None:
    source.run("CREATE TABLE t (k date PRIMARY KEY)",
               "INSERT INTO t SELECT date '2024-01-01' + g FROM generate_series(1, 3000) g")  # fmt: skip
    with pytest.raises(ValueError, match="connect\\(values=True\\): DateStyle is 'SQL, DMY'"):
        plan_chunks(source.hostile, T, chunk_size=1000)


def test_an_integer_key_plans_in_any_session(source: Source) -> None:
    source.run(
        "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t SELECT generate_series(1, 3000)"
    )
    assert len(plan_chunks(source.hostile, T, chunk_size=1000).chunks) == 3
