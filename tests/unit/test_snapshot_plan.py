"""Chunk plans render to SQL predicates without a database and persist as JSON unchanged."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import cdc_core.snapshot_plan
from cdc_core.identifiers import TableName
from cdc_core.snapshot_plan import Chunk, ChunkPlan, chunk_predicate

ORDERS = TableName("public", "orders")
HOSTILE = 'x"; DROP TABLE y; --'


def plan(
    key: tuple[str, ...],
    types: tuple[str, ...],
    *bounds: tuple[str | None, ...],
    nullable: tuple[str, ...] = (),
    table: TableName = ORDERS,
) -> ChunkPlan:
    """A plan cut at `bounds`: chunk 0 below the first, the last from the last bound up."""
    edges = [None, *bounds, None]
    chunks = tuple(Chunk(i, edges[i], edges[i + 1]) for i in range(len(edges) - 1))
    return ChunkPlan(table, key, types, chunks, 1000, nullable)


def predicates(p: ChunkPlan) -> list[str]:
    return [chunk_predicate(p, c) for c in p.chunks]


def test_an_integer_key_renders_half_open_ranges_cast_to_the_key_type() -> None:
    assert predicates(plan(("id",), ("bigint",), ("100",), ("200",))) == [
        """"id" < '100'::bigint""",
        """"id" >= '100'::bigint AND "id" < '200'::bigint""",
        """"id" >= '200'::bigint""",
    ]


def test_a_composite_key_renders_row_comparisons() -> None:
    p = plan(("a", "b"), ("text", "integer"), ("x", "3"), ("y", "1"))
    assert (
        predicates(p)[1]
        == """("a", "b") >= ('x'::text, '3'::integer) AND ("a", "b") < ('y'::text, '1'::integer)"""
    )


def test_a_plan_without_a_key_renders_tid_ranges_of_blocks() -> None:
    assert predicates(plan((), (), ("1000",), ("2000",))) == [
        "ctid < '(1000,0)'::tid",
        "ctid >= '(1000,0)'::tid AND ctid < '(2000,0)'::tid",
        "ctid >= '(2000,0)'::tid",
    ]


@pytest.mark.parametrize(("key", "types"), [(("id",), ("bigint",)), ((), ())])
def test_a_single_unbounded_chunk_selects_everything(
    key: tuple[str, ...], types: tuple[str, ...]
) -> None:
    assert predicates(plan(key, types)) == ["TRUE"]


def test_type_names_with_modifiers_and_schemas_are_used_as_given() -> None:
    p = plan(("k", "t"), ("character(5)", '"My Schema".mood'), ("ab   ", "happy"))
    assert predicates(p)[0] == """("k", "t") < ('ab   '::character(5), 'happy'::"My Schema".mood)"""


def test_quotes_in_identifiers_are_doubled() -> None:
    p = plan((HOSTILE,), ("text",), ("m",), table=TableName("public", HOSTILE))
    assert predicates(p)[1] == """"x""; DROP TABLE y; --" >= 'm'::text"""


def test_quotes_in_values_are_doubled() -> None:
    p = plan(("k",), ("text",), ("it's'; DROP TABLE y; --",))
    assert predicates(p)[0] == """"k" < 'it''s''; DROP TABLE y; --'::text"""


def test_values_with_backslashes_use_escape_strings_that_read_the_same_either_way() -> None:
    # E'...' reads the same whatever standard_conforming_strings is on the reading session.
    p = plan(("k",), ("text",), ("a\\'b\\\\c",))
    assert predicates(p)[0] == """"k" < E'a\\\\''b\\\\\\\\c'::text"""


def test_a_null_value_in_a_bound_renders_as_a_typed_null() -> None:
    assert predicates(plan(("a", "b"), ("text", "integer"), ("x", None)))[0] == (
        """("a", "b") < ('x'::text, NULL::integer)"""
    )


def test_rows_with_a_null_in_a_nullable_key_belong_to_the_last_chunk_only() -> None:
    p = plan(("a", "b"), ("text", "integer"), ("m", "1"), nullable=("b",))
    assert predicates(p) == [
        """("a", "b") < ('m'::text, '1'::integer) AND "b" IS NOT NULL""",
        """(("a", "b") >= ('m'::text, '1'::integer) OR "b" IS NULL)""",
    ]


def test_a_nullable_key_in_one_chunk_still_selects_everything() -> None:
    assert predicates(plan(("a",), ("text",), nullable=("a",))) == ["TRUE"]


def test_a_block_number_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        predicates(plan((), (), ("1); DROP TABLE y; --",)))


def test_a_chunk_survives_json() -> None:
    chunk = Chunk(3, ("a'\\b", "7"), None)
    assert Chunk.from_json(json.loads(json.dumps(chunk.to_json()))) == chunk


@pytest.mark.parametrize(
    "p",
    [
        plan(("id",), ("bigint",), ("100",), ("200",)),
        plan(("a", "b"), ("text", "integer"), ("x'\\", "3"), nullable=("b",)),
        plan((), (), ("1000",)),
        plan(("k",), ("text",), table=TableName("Sales Team", HOSTILE)),
    ],
)
def test_a_plan_survives_json_with_the_same_chunks(p: ChunkPlan) -> None:
    again = ChunkPlan.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p
    assert predicates(again) == predicates(p)


def test_a_plan_written_without_nullable_columns_reads_back() -> None:
    data = plan(("id",), ("bigint",)).to_json()
    del data["nullable"]
    assert ChunkPlan.from_json(data).nullable == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"table": "public.orders"}, "table must be"),
        ({"key": "id"}, "key must be a list of strings"),
        ({"estimated_rows": "many"}, "estimated_rows must be an integer"),
        ({"chunks": [{"number": "0", "lower": None, "upper": None}]}, "number must be"),
        ({"chunks": [{"number": 0, "lower": None, "upper": [1]}]}, "bound must be null or"),
    ],
)
def test_a_damaged_plan_is_refused_with_the_field_named(
    change: dict[str, object], message: str
) -> None:
    data = plan(("id",), ("bigint",)).to_json() | change
    with pytest.raises(ValueError, match=message):
        ChunkPlan.from_json(data)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ((), "a first chunk unbounded below"),
        ((Chunk(0, ("1",), None),), "a first chunk unbounded below"),
        ((Chunk(0, None, ("5",)), Chunk(1, ("6",), None)), "start where the one before ends"),
        ((Chunk(0, None, ("5",)), Chunk(2, ("5",), None)), "numbered 0, 1"),
        ((Chunk(0, None, ("5", "1")), Chunk(1, ("5", "1"), None)), "bounds of 1 value"),
    ],
)
def test_chunks_that_could_miss_or_repeat_rows_are_refused(
    chunks: tuple[Chunk, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkPlan(ORDERS, ("id",), ("bigint",), chunks, 0)


def test_planning_imports_no_spark() -> None:
    tree = ast.parse(Path(cdc_core.snapshot_plan.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "pyspark"]
