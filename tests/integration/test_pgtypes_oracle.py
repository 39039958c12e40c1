"""pgtypes against a real PostgreSQL: every converted text equals the server's own binary value.

Each case stores edge values in a column, then one query fetches the column's text output
(under the capture session's settings) and an oracle in the binary protocol: psycopg's
native value, or the type's `*_send` bytes decoded here. The text parser is therefore
checked against an implementation that never reads text.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import time
from decimal import Decimal
from itertools import count
from typing import Any

import psycopg
import pytest

from cdc_core.pg.catalog import resolve_types
from cdc_core.pgtypes import ColumnType, SilverType, TypeModes, Unrepresentable, converter
from cdc_core.pgtypes import silver_type as silver
from cdc_core.pgtypes.containers import parse_array
from tests.integration.conftest import PgServer

SESSION = (
    "SET DateStyle = 'ISO, MDY'",
    "SET IntervalStyle = 'iso_8601'",
    "SET TimeZone = 'UTC'",
    "SET extra_float_digits = 1",
    "SET bytea_output = 'hex'",
    "SET lc_monetary = 'C'",
)
UNREPRESENTABLE = object()
EPOCH_2000_DAYS = 10_957
EPOCH_2000_US = EPOCH_2000_DAYS * 86_400_000_000
MIN_US, MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999
MIN_DAYS, MAX_DAYS = -719_162, 2_932_896
MONTH_US = 2_629_800_000_000
Connection = psycopg.Connection[Any]


# --- oracles: the server's binary form, decoded independently ---------------------------


def signed(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=True)


def unsigned(b: bytes) -> int:
    return int.from_bytes(b, "big")


def days(b: bytes) -> object:
    d = signed(b) + EPOCH_2000_DAYS
    return d if MIN_DAYS <= d <= MAX_DAYS else UNREPRESENTABLE


def micros(b: bytes) -> object:
    us = signed(b) + EPOCH_2000_US
    return us if MIN_US <= us <= MAX_US else UNREPRESENTABLE


def interval_micros(b: bytes) -> object:
    time_us, day, month = struct.unpack(">qii", b)
    us = month * MONTH_US + day * 86_400_000_000 + time_us
    return us if -(2**63) <= us < 2**63 else UNREPRESENTABLE


def money(b: bytes) -> Decimal:
    return Decimal(signed(b)).scaleb(-2)


def point(b: bytes) -> dict[str, float]:
    x, y = struct.unpack(">dd", b)
    return {"x": x, "y": y}


def bits(b: bytes) -> str:
    length = signed(b[:4])
    return "".join(f"{byte:08b}" for byte in b[4:])[:length]


def lsn(b: bytes) -> str:
    value = unsigned(b)
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def finite_decimal(d: Decimal) -> object:
    return d if d.is_finite() else UNREPRESENTABLE


def each(f: Callable[[Any], object]) -> Callable[[list[Any]], object]:
    """An element oracle lifted to arrays; one Unrepresentable element spoils the array."""

    def lifted(values: list[Any]) -> object:
        out = [None if v is None else f(v) for v in values]
        return UNREPRESENTABLE if any(v is UNREPRESENTABLE for v in out) else out

    return lifted


def same(ours: object, theirs: object) -> bool:
    """Equal and of the same type: Decimal scale, float sign of zero and NaN included."""
    if isinstance(theirs, float):
        if math.isnan(theirs):
            return isinstance(ours, float) and math.isnan(ours)
        return isinstance(ours, float) and ours == theirs and str(ours) == str(theirs)
    if isinstance(theirs, Decimal):
        return isinstance(ours, Decimal) and str(ours) == str(theirs)
    if isinstance(theirs, list):
        return (
            isinstance(ours, list)
            and len(ours) == len(theirs)
            and all(same(a, b) for a, b in zip(ours, theirs, strict=True))
        )
    if isinstance(theirs, dict):
        return (
            isinstance(ours, dict)
            and list(ours) == list(theirs)
            and all(same(ours[k], theirs[k]) for k in theirs)
        )
    return type(ours) is type(theirs) and ours == theirs


# --- the catalog helper: a column's ColumnType, resolved as the product must ----------


def one(
    conn: Connection, query: str, params: tuple[Any, ...] = (), *, binary: bool = False
) -> tuple[Any, ...]:
    row = conn.cursor(binary=binary).execute(query, params).fetchone()
    assert row is not None, query
    return tuple(row)


def column_type(conn: Connection, table: str, column: str = "v") -> ColumnType:
    """The product's reading of the catalog: through domains (their typmod when the column has
    none), then arrays, then domains."""
    type_oid, typmod = one(
        conn,
        "SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
        (table, column),
    )
    ((name, kind, modifier, array),) = resolve_types(conn, [(int(type_oid), int(typmod))])
    return ColumnType(name, kind, modifier, array)


# --- cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A column type, edge values (SQL expressions) and how to read the server's value."""

    sqltype: str
    values: tuple[str, ...]
    oracle: str = "v"
    """SQL over column v, fetched in binary."""
    theirs: Callable[[Any], object] = lambda x: x
    """Oracle value -> our representation, or UNREPRESENTABLE."""
    ours: Callable[[Any], object] = lambda x: x
    """Our value -> a form comparable with `theirs` (for text kept as is but parsed by them)."""
    unrepresentable: str = "false"
    """SQL over v: the value is expected to be Unrepresentable."""
    modes: TypeModes = field(default_factory=TypeModes)
    cast_is_output: bool = True
    """`v::text` prints what the output function prints (char(n)'s cast trims the padding)."""

    @property
    def id(self) -> str:
        changed = [f"{k}={v}" for k, v in vars(self.modes).items() if v != getattr(TypeModes(), k)]
        return " ".join([self.sqltype, *changed])


INTS = ("0", "-1", "NULL")
NUMERIC_EDGES = ("0", "1.5", "-0.01", "'NaN'", "NULL")
FLOAT_EDGES = ("0", "'-0'", "'NaN'", "'Infinity'", "'-Infinity'", "0.1", "NULL")
TEXTS = (
    "''",
    "'plain'",
    "'ünïcödé ✓ 😀'",
    "E'tab\\there\\nnew \"quote\" back\\\\slash'",
    "repeat('x', 1000000)",
    "repeat('é😀', 250000)",
    "NULL",
)
DATES = (
    *("'1970-01-01'", "'2017-09-15'", "'0001-01-01'", "'9999-12-31'", "'0001-12-31 BC'"),
    *("'4713-01-01 BC'", "'10000-01-01'", "'5874897-12-31'", "'infinity'", "'-infinity'", "NULL"),
)
TIMESTAMPS = (
    *("'1970-01-01 00:00:00'", "'2018-06-20 15:13:16.945104'", "'1969-12-31 23:59:59.999999'"),
    *("'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'", "'2000-02-29 12:00:00.5'"),
    *("'0044-03-15 12:00:00 BC'", "'10000-01-01 00:00:00'", "'294276-12-31 23:59:59.999999'"),
    *("'infinity'", "'-infinity'", "NULL"),
)
TIMES = ("'00:00:00'", "'04:05:11.789'", "'23:59:59.999'", "'24:00:00'", "NULL")
INTERVALS = (
    *("'0'", "'1 year 2 months 3 days 04:05:06.78'", "'-1 year -2 months +3 days -04:05:06.78'"),
    *("'-0.5 seconds'", "'1000000 hours'", "'1 microsecond'", "'2147483647 days'"),
    *("'178000000 years'", "'-178000000 years'", "NULL"),
)
HSTORES = (
    "''",
    "'a=>1, b=>NULL'",
    "hstore(ARRAY['q\"uote', 'back\\slash', 'b c', ''], ARRAY['x', 'v\\', NULL, ''])",
    "hstore('é', 'ü😀')",
    "NULL",
)
MULTI_DIM = "array_ndims(v) > 1 OR array_lower(v, 1) <> 1"


def elements(expr: str) -> str:
    """An oracle over the elements v[i] of a one-dimensional array, in order."""
    return f"array(SELECT {expr} FROM generate_subscripts(v, 1) AS i ORDER BY i)"


CASES = [
    Case("smallint", ("-32768", "32767", *INTS)),
    Case("integer", ("-2147483648", "2147483647", *INTS)),
    Case("bigint", ("-9223372036854775808", "9223372036854775807", *INTS)),
    Case("oid", ("0", "4294967295", "NULL")),
    Case("xid", ("'0'", "'4294967295'", "NULL"), theirs=unsigned),
    Case("cid", ("'0'", "'4294967295'", "NULL"), theirs=unsigned),
    Case("xid8", ("'0'", "'18446744073709551615'", "NULL"), theirs=lambda b: Decimal(unsigned(b))),
    Case(
        "numeric(12,2)", ("-9999999999.99", "9999999999.99", *NUMERIC_EDGES), theirs=finite_decimal
    ),
    Case("numeric(38,0)", ("-" + "9" * 38, "9" * 38, "NULL"), theirs=finite_decimal),
    Case("numeric(38,38)", ("0." + "9" * 38, "-0." + "0" * 37 + "1"), theirs=finite_decimal),
    Case("numeric(3,-2)", ("12345", "-99900", "0"), theirs=finite_decimal),
    Case("numeric(2,4)", ("0.0012", "-0.0099", "0"), theirs=finite_decimal),
    Case("numeric(39,2)", ("1" * 37 + ".25", *NUMERIC_EDGES), theirs=lambda d: format(d, "f")),
    Case(
        "numeric",
        (
            *("repeat('9', 600)::numeric + 0." + "1" * 400, "'Infinity'", "'-Infinity'"),
            *("1e-100", *NUMERIC_EDGES),
        ),
        theirs=lambda d: format(d, "f"),
    ),
    Case("numeric(12,2)", NUMERIC_EDGES, theirs=float, modes=TypeModes(decimal="double")),
    Case(
        "numeric", ("'Infinity'", *NUMERIC_EDGES), theirs=float, modes=TypeModes(decimal="double")
    ),
    Case(
        "numeric(12,2)",
        NUMERIC_EDGES,
        theirs=lambda d: format(d, "f"),
        modes=TypeModes(decimal="string"),
    ),
    Case("real", ("3.4028235e38", "-3.4028235e38", "1e-45", "1.17549435e-38", *FLOAT_EDGES)),
    Case(
        "double precision",
        (
            "1.7976931348623157e308",
            "5e-324",
            "2.2250738585072014e-308",
            "3.141592653589793",
            *FLOAT_EDGES,
        ),
    ),
    Case(
        "money",
        (
            "-92233720368547758.08",
            "92233720368547758.07",
            "1234.56",
            "-1234.56",
            "0.01",
            "0",
            "NULL",
        ),
        oracle="cash_send(v)",
        theirs=money,
    ),
    Case(
        "money",
        ("-1234.56", "0.01"),
        oracle="cash_send(v)",
        theirs=lambda b: float(money(b)),
        modes=TypeModes(decimal="double"),
    ),
    Case(
        "money",
        ("-1234.56", "0.01"),
        oracle="cash_send(v)",
        theirs=lambda b: str(money(b)),
        modes=TypeModes(decimal="string"),
    ),
    Case("boolean", ("true", "false", "NULL")),
    Case("bit(1)", ("B'1'", "B'0'", "NULL"), oracle="v = B'1'"),
    Case("bit(10)", ("B'1010101010'", "B'0000000000'"), oracle="bit_send(v)", theirs=bits),
    Case("varbit", ("B''", "B'1'", "B'101'"), oracle="varbit_send(v)", theirs=bits),
    Case("text", TEXTS),
    Case("varchar(5)", ("'ab'", "'abcde'", "'é😀'", "''", "NULL")),
    Case("char(5)", ("'ab'", "'abcde'", "'é'", "''", "NULL"), cast_is_output=False),
    Case("name", ("'pg_class'", "'é'", "''")),
    Case('"char"', ("'a'", "'z'", "NULL")),
    Case("citext", TEXTS, theirs=lambda b: b.decode()),
    Case(
        "bytea", ("'\\x'", "'\\x00ff'", "decode(repeat('ab', 500000), 'hex')", "'\\x5c22'", "NULL")
    ),
    Case(
        "bytea",
        ("'\\x'", "'\\xfbff00'"),
        theirs=lambda b: base64.b64encode(b).decode(),
        modes=TypeModes(binary="base64"),
    ),
    Case(
        "bytea",
        ("'\\xfbff00'",),
        theirs=lambda b: base64.urlsafe_b64encode(b).decode(),
        modes=TypeModes(binary="base64-url-safe"),
    ),
    Case(
        "bytea", ("'\\x'", "'\\x00ABff'"), theirs=lambda b: b.hex(), modes=TypeModes(binary="hex")
    ),
    Case("date", DATES, oracle="date_send(v)", theirs=days),
    Case("timestamp", TIMESTAMPS, oracle="timestamp_send(v)", theirs=micros),
    Case(
        "timestamptz",
        (
            *TIMESTAMPS,
            "'2021-06-05 07:23:45.5+05:30'",
            "'0001-01-01 00:30:00+01'",
            "'9999-12-31 23:30:00-01'",
        ),
        oracle="timestamptz_send(v)",
        theirs=micros,
    ),
    Case("time", (*TIMES, "'23:59:59.999999'"), oracle="time_send(v)", theirs=signed),
    Case("time(3)", TIMES, oracle="time_send(v)", theirs=lambda b: signed(b) // 1000),
    Case("time(0)", TIMES, oracle="time_send(v)", theirs=lambda b: signed(b) // 1000),
    Case(
        "time(6)",
        ("'23:59:59.999999'", *TIMES),
        oracle="time_send(v)",
        theirs=lambda b: signed(b) // 1000,
        modes=TypeModes(time_precision="connect"),
    ),
    Case(
        "time(3)",
        TIMES,
        oracle="time_send(v)",
        theirs=signed,
        modes=TypeModes(time_precision="microseconds"),
    ),
    Case("time(3)", TIMES, oracle="v::text", modes=TypeModes(time_precision="isostring")),
    Case(
        "time",
        (*TIMES, "'23:59:59.999999'", "'00:00:00.000001'"),
        oracle="time_send(v)",
        theirs=lambda b: signed(b) * 1000,
        modes=TypeModes(time_precision="nanoseconds"),
    ),
    Case(
        "timetz",
        ("'04:05:06.789+05:30'", "'00:00:00+00'", "'23:59:59.999999-15:59'", "NULL"),
        ours=time.fromisoformat,
    ),
    Case("interval", INTERVALS, oracle="v::text"),
    Case(
        "interval",
        INTERVALS,
        oracle="interval_send(v)",
        theirs=interval_micros,
        modes=TypeModes(interval="numeric"),
    ),
    Case(
        "uuid",
        ("'00000000-0000-0000-0000-000000000000'", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"),
        theirs=str,
    ),
    Case(
        "json",
        ('\'{"a": [1, 2.5, null], "b": "é"}\'', "'[]'", "'\"s\"'", "'null'", "'1e400'"),
        ours=json.loads,
    ),
    Case(
        "jsonb", ('\'{"b": {"c": true}, "a": "😀"}\'', "'[1, \"x\"]'", "'12.50'"), ours=json.loads
    ),
    Case("xml", ("'<a>é</a>'", "'text only'"), theirs=lambda b: b.decode()),
    Case(
        "inet",
        ("'1.2.3.4'", "'1.2.3.4/24'", "'::1'", "'2001:db8::1/64'"),
        theirs=ipaddress.ip_interface,
        ours=ipaddress.ip_interface,
    ),
    Case("cidr", ("'10.0.0.0/8'", "'2001:db8::/32'"), ours=ipaddress.ip_network),
    Case("macaddr", ("'08:00:2b:01:02:03'",), theirs=lambda b: b.hex(":")),
    Case("macaddr8", ("'08:00:2b:01:02:03:04:05'",), theirs=lambda b: b.hex(":")),
    Case(
        "pg_lsn",
        ("'0/0'", "'16/B374D848'", "'FFFFFFFF/FFFFFFFF'"),
        oracle="pg_lsn_send(v)",
        theirs=lsn,
    ),
    Case(
        "point",
        ("'(1.5,2)'", "'(NaN,Infinity)'", "'(-0,1e-300)'", "NULL"),
        oracle="point_send(v)",
        theirs=point,
    ),
    Case("hstore", HSTORES, oracle="hstore_to_json(v)", ours=json.loads),
    Case("hstore", HSTORES, oracle="hstore_to_json(v)", modes=TypeModes(hstore="map")),
    Case(
        "integer[]",
        (
            "'{}'",
            "'{1,2,NULL}'",
            "'{-2147483648,2147483647}'",
            "'{{1,2},{3,4}}'",
            "'[2:3]={1,2}'",
            "NULL",
        ),
        unrepresentable=MULTI_DIM,
    ),
    Case(
        "text[]",
        (
            "'{}'",
            "ARRAY['a b', 'c\"d', NULL, 'NULL', 'x\\y', '', '{}', ',', 'é😀', ' ']",
            "ARRAY[repeat('x', 100000)]",
            "'{{a,b},{c,d}}'",
        ),
        unrepresentable=MULTI_DIM,
    ),
    Case("bytea[]", ("ARRAY['\\x00ff'::bytea, NULL, '\\x']",)),
    Case("numeric(5,2)[]", ("'{1.5,-2}'", "'{1,NaN}'", "'{}'"), theirs=each(finite_decimal)),
    Case("double precision[]", ("'{NaN,-Infinity,-0,0.1}'",)),
    Case("boolean[]", ("'{t,f,NULL}'",)),
    Case("uuid[]", ("ARRAY[gen_random_uuid(), NULL]",), theirs=each(str)),
    Case(
        "date[]",
        ("'{2017-09-15,NULL}'", "'{0001-01-01,infinity}'"),
        oracle=elements("date_send(v[i])"),
        theirs=each(days),
    ),
    Case(
        "timestamptz[]",
        ("'{\"2021-06-05 07:23:45.5+05:30\",NULL}'",),
        oracle=elements("timestamptz_send(v[i])"),
        theirs=each(micros),
    ),
    Case("point[]", ('\'{"(1,2)",NULL,"(-0.5,NaN)"}\'',), theirs=each(point)),
    Case(
        "box[]",
        ("ARRAY['(1,2),(0,0)'::box, '(3,4),(1,1)']",),
        oracle=elements("v[i]::text"),
    ),
    Case(
        "jsonb[]",
        (r"""ARRAY['{"a": "b,}\""}'::jsonb, NULL]""",),
        ours=lambda xs: [None if x is None else json.loads(x) for x in xs],
    ),
    Case(
        "hstore[]",
        ('ARRAY[\'"a"=>"b,}"\'::hstore, NULL]',),
        oracle=elements("hstore_to_json(v[i])"),
        ours=lambda xs: [None if x is None else json.loads(x) for x in xs],
    ),
]
# Types kept as their exact text: the oracle is the text itself.
TEXT_KEPT = [
    Case("tsvector", ("'a fat:2 cat''s'",), oracle="v::text"),
    Case("tsquery", ("'fat & (rat | cat)'",), oracle="v::text"),
    Case("line", ("'{1,-1,0}'",), oracle="v::text"),
    Case("lseg", ("'[(0,0),(1,1.5)]'",), oracle="v::text"),
    Case("box", ("'(1,2),(0,0)'",), oracle="v::text"),
    Case("path", ("'[(0,0),(1,1)]'", "'((0,0),(1,1))'"), oracle="v::text"),
    Case("polygon", ("'((0,0),(1,1),(1,0))'",), oracle="v::text"),
    Case("circle", ("'<(1,2),3>'",), oracle="v::text"),
    Case("mood", ("'happy'", "'very \"sad\"'"), oracle="v::text"),
    Case("pair", ("ROW(1, 'a b')", "ROW(NULL, '\"q\"')"), oracle="v::text"),
    Case(
        "pair[]",
        ("ARRAY[ROW(1, 'a b')::pair, NULL]",),
        oracle=elements("v[i]::text"),
    ),
    Case("int4range", ("'[1,3)'", "'empty'", "'(,5]'"), oracle="v::text"),
    Case("tstzrange", ("'[2021-01-01,infinity)'",), oracle="v::text"),
    Case("int4multirange", ("'{[1,3), [5,7)}'", "'{}'"), oracle="v::text"),
    Case("timetz", ("'24:00:00+00'",), oracle="v::text"),
]
TYPES_SQL = (
    "CREATE EXTENSION IF NOT EXISTS hstore",
    "CREATE EXTENSION IF NOT EXISTS citext",
    "CREATE TYPE mood AS ENUM ('happy', 'very \"sad\"')",
    "CREATE TYPE pair AS (n integer, s text)",
)


@pytest.fixture(scope="module")
def conn(pg: PgServer) -> Iterator[Connection]:
    """One database for the module, with the extensions and types the cases use."""
    name = pg.create_database("pgtypes")
    try:
        with psycopg.connect(pg.dsn(name), autocommit=True) as c:
            for statement in (*TYPES_SQL, *SESSION):
                c.execute(statement)
            yield c
    finally:
        pg.drop_database(name)


TABLES = count()


OUTPUT_TEXT = "CASE WHEN v IS NULL THEN NULL ELSE format('%s', v) END"
"""The type's output function, which is what pgoutput sends; `v::text` differs for a few."""


def run_case(conn: Connection, case: Case) -> int:
    """Insert the values, fetch texts and oracle in one query, compare; returns rows checked."""
    table = f"t{next(TABLES)}"
    conn.execute(f"CREATE TABLE {table} (id int GENERATED ALWAYS AS IDENTITY, v {case.sqltype})")
    for value in case.values:
        conn.execute(f"INSERT INTO {table} (v) VALUES ({value})")
    convert = converter(column_type(conn, table), case.modes)
    query = (
        f"SELECT {OUTPUT_TEXT}, v::text, {case.oracle}, coalesce({case.unrepresentable}, false) "
        f"FROM {table} ORDER BY id"
    )
    rows = conn.cursor(binary=True).execute(query).fetchall()
    for output_text, cast_text, oracle, unrepresentable in rows:
        if output_text is None:
            assert oracle is None
            continue
        expected = UNREPRESENTABLE if unrepresentable else case.theirs(oracle)
        for text in (output_text, cast_text) if case.cast_is_output else (output_text,):
            if expected is UNREPRESENTABLE:
                with pytest.raises(Unrepresentable):
                    convert(text)
                continue
            ours = case.ours(convert(text))
            assert same(ours, expected), (
                f"{case.id}: {text[:80]!r} -> {ours!r}, server {expected!r}"
            )
    return len(rows)


@pytest.mark.parametrize("case", CASES + TEXT_KEPT, ids=lambda c: c.id)
def test_converted_text_equals_the_servers_value(conn: Connection, case: Case) -> None:
    assert run_case(conn, case) == len(case.values)


@pytest.mark.parametrize(
    ("sqltype", "expected"),
    [
        ("mood", ColumnType("mood", "e", -1, False)),
        ("pair[]", ColumnType("pair", "c", -1, True)),
        ("int4multirange", ColumnType("int4multirange", "m", -1, False)),
        ("hstore", ColumnType("hstore", "b", -1, False)),
        ("numeric(12,2)[]", ColumnType("numeric", "b", ((12 << 16) | 2) + 4, True)),
        ("point", ColumnType("point", "b", -1, False)),
        ('"char"', ColumnType("char", "b", -1, False)),
        ("int2vector", ColumnType("int2vector", "b", -1, False)),  # not an array of int2
        ("oidvector", ColumnType("oidvector", "b", -1, False)),
        ("time(3)", ColumnType("time", "b", 3, False)),
        ("bit(1)", ColumnType("bit", "b", 1, False)),
        ("varchar(40)", ColumnType("varchar", "b", 44, False)),
    ],
)
def test_catalog_helper_reads_the_column_type(
    conn: Connection, sqltype: str, expected: ColumnType
) -> None:
    table = f"t{next(TABLES)}"
    conn.execute(f"CREATE TABLE {table} (v {sqltype})")
    assert column_type(conn, table) == expected


def test_domains_resolve_to_their_base_type_with_its_modifier(conn: Connection) -> None:
    conn.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
    conn.execute("CREATE DOMAIN sale_price AS price")
    conn.execute("CREATE DOMAIN prices AS price[]")
    conn.execute("CREATE TABLE priced (a price, b sale_price, c price[], d prices)")
    conn.execute("INSERT INTO priced VALUES (1.5, 2, '{3,NULL}', '{4.25}')")
    decimal = SilverType("decimal", precision=10, scale=2)
    texts = one(conn, "SELECT a::text, b::text, c::text, d::text FROM priced")
    expected: list[object] = [
        Decimal("1.50"),
        Decimal("2.00"),
        [Decimal("3.00"), None],
        [Decimal("4.25")],
    ]
    for column, text, value in zip("abcd", texts, expected, strict=True):
        t = column_type(conn, "priced", column)
        assert silver(t) == (decimal if column in "ab" else SilverType("array", element=decimal))
        assert converter(t)(text) == value


def test_nested_array_text_parses_like_the_server(conn: Connection) -> None:
    query = "SELECT v::text, v FROM (VALUES (%s::text[])) AS t(v)"
    for literal in ('{{"a b",NULL},{"}","\\\\"}}', "{{{1}},{{2}}}", '{{"NULL",NULL}}'):
        text, value = one(conn, query, (literal,), binary=True)
        assert parse_array(text, str) == value


# --- random sweeps: many values per type, one round trip each --------------------------


def random_floats(rng: random.Random, n: int, fmt: str) -> list[float]:
    """Random bit patterns (so every exponent and subnormals appear), NaN and infinities out."""
    width = struct.calcsize(fmt)
    out = [
        struct.unpack(fmt, rng.getrandbits(8 * width).to_bytes(width, "little"))[0]
        for _ in range(n)
    ]
    return [x for x in out if math.isfinite(x)]


def sweep(conn: Connection, select: str, *columns: list[Any]) -> list[tuple[Any, ...]]:
    """The (text, oracle) rows of `select` over parameter arrays, in one round trip."""
    return conn.cursor(binary=True).execute(select, columns).fetchall()


def test_random_float4_and_float8_values_convert_exactly(conn: Connection) -> None:
    rng = random.Random(20240605)
    select = "SELECT x::text, x FROM (SELECT unnest(%s::float8[])::{} AS x) s"
    for name, fmt in (("float4", "<f"), ("float8", "<d")):
        convert = converter(ColumnType(name, "b", -1, False))
        for text, value in sweep(conn, select.format(name), random_floats(rng, 20_000, fmt)):
            assert same(convert(text), value), text


@pytest.mark.parametrize("name", ["timestamptz", "timestamp"])
def test_random_timestamps_convert_exactly(conn: Connection, name: str) -> None:
    rng = random.Random(7)
    offsets = [rng.randrange(MIN_US, MAX_US + 1) for _ in range(10_000)]
    select = (
        f"SELECT v::text, {name}_send(v) FROM "
        f"(SELECT {name} 'epoch' + x * interval '1 microsecond' AS v FROM unnest(%s::int8[]) x) s"
    )
    convert = converter(ColumnType(name, "b", -1, False))
    for text, raw in sweep(conn, select, offsets):
        assert convert(text) == micros(raw), text


def test_random_dates_and_times_convert_exactly(conn: Connection) -> None:
    rng = random.Random(8)
    select = "SELECT v::text, date_send(v) FROM (SELECT date 'epoch' + unnest(%s::int4[]) AS v) s"
    convert = converter(ColumnType("date", "b", -1, False))
    for text, raw in sweep(
        conn, select, [rng.randrange(MIN_DAYS, MAX_DAYS + 1) for _ in range(10_000)]
    ):
        assert convert(text) == days(raw), text
    select = (
        "SELECT v::text, time_send(v) FROM "
        "(SELECT time '00:00' + x * interval '1 microsecond' AS v FROM unnest(%s::int8[]) x) s"
    )
    convert = converter(ColumnType("time", "b", -1, False))
    for text, raw in sweep(conn, select, [rng.randrange(86_400_000_000) for _ in range(10_000)]):
        assert convert(text) == signed(raw), text


@pytest.mark.parametrize(
    "zone", ["Europe/Amsterdam", "Asia/Kolkata", "America/St_Johns", "Pacific/Chatham"]
)
def test_timestamptz_text_in_other_time_zones_parses_to_the_same_instant(
    conn: Connection, zone: str
) -> None:
    """Offsets like -03:30, +12:45 and the local mean time +00:19:32 (Amsterdam before 1937)."""
    rng = random.Random(11)
    offsets = [rng.randrange(-(5 * 10**15), 5 * 10**15) for _ in range(3_000)]  # 1812..2128
    select = (
        "SELECT v::text, timestamptz_send(v) FROM "
        "(SELECT timestamptz 'epoch' + x * interval '1 microsecond' AS v FROM unnest(%s::int8[]) x) s"
    )
    convert = converter(ColumnType("timestamptz", "b", -1, False))
    conn.execute(f"SET TimeZone = '{zone}'")
    try:
        for text, raw in sweep(conn, select, offsets):
            assert convert(text) == micros(raw), text
    finally:
        conn.execute("SET TimeZone = 'UTC'")


def test_random_numeric_values_convert_exactly(conn: Connection) -> None:
    rng = random.Random(3)
    values = [Decimal(rng.randrange(-(10**12) + 1, 10**12)).scaleb(-2) for _ in range(10_000)]
    select = "SELECT x::text, x FROM (SELECT unnest(%s::numeric[])::numeric(12,2) AS x) s"
    convert = converter(ColumnType("numeric", "b", ((12 << 16) | 2) + 4, False))
    for text, value in sweep(conn, select, values):
        assert same(convert(text), value), text


def test_random_intervals_convert_exactly_in_numeric_mode(conn: Connection) -> None:
    rng = random.Random(4)
    n = 10_000
    months = [rng.randrange(-(10**5), 10**5) for _ in range(n)]
    day_counts = [rng.randrange(-(10**6), 10**6) for _ in range(n)]
    micro_counts = [rng.randrange(-(10**14), 10**14) for _ in range(n)]
    select = (
        "SELECT v::text, interval_send(v) FROM (SELECT make_interval(months => m, days => d) "
        "+ u * interval '1 microsecond' AS v FROM unnest(%s::int4[], %s::int4[], %s::int8[]) p(m, d, u)) s"
    )
    convert = converter(ColumnType("interval", "b", -1, False), TypeModes(interval="numeric"))
    for text, raw in sweep(conn, select, months, day_counts, micro_counts):
        assert convert(text) == interval_micros(raw), text
