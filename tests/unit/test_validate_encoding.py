"""validate's canonical encoding (the Python reference both engines are held to)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from cdc_core.columns import Rule
from cdc_core.pgtypes import ColumnType, SilverType, TypeModes, silver_type
from cdc_core.pgtypes.schema import (
    BINARY,
    BOOLEAN,
    DATE,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    POINT,
    STRING,
    STRING_MAP,
    TIMESTAMP,
    array_of,
    decimal_type,
)
from cdc_core.validate_encoding import (
    PgForm,
    apply_steps,
    hash60,
    java_hex,
    pg_form,
    raw_token,
    row_text,
    text_steps,
    token,
)


def numeric(p: int, s: int) -> ColumnType:
    return ColumnType("numeric", "b", ((p << 16) | (s & 0x7FF)) + 4, False)


@pytest.mark.parametrize(
    ("value", "java"),
    [
        (1.5, "0x1.8p0"), (-1.5, "-0x1.8p0"), (0.0, "0x0.0p0"), (-0.0, "-0x0.0p0"),
        (0.1, "0x1.999999999999ap-4"), (1024.0, "0x1.0p10"), (5e-324, "0x0.0000000000001p-1022"),
        (2.2250738585072014e-308, "0x1.0p-1022"), (1.7976931348623157e308, "0x1.fffffffffffffp1023"),
        (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity"),
    ],
)  # fmt: skip
def test_floats_are_written_as_java_writes_them_in_hexadecimal(value: float, java: str) -> None:
    assert java_hex(value) == java


def test_every_nan_is_one_token() -> None:
    import struct

    (other_nan,) = struct.unpack(">d", bytes.fromhex("fff8000000000001"))
    assert token(other_nan, DOUBLE) == token(math.nan, DOUBLE) == "V3:NaN"


@pytest.mark.parametrize(
    ("value", "silver", "expected"),
    [
        (None, STRING, "N"),
        ("", STRING, "V0:"),
        ("N", STRING, "V1:N"),
        ("héllo 😀", STRING, "V7:héllo 😀"),  # characters (code points), not bytes
        (True, BOOLEAN, "V1:t"),
        (-42, INT, "V3:-42"),
        (Decimal("-1.50"), decimal_type(10, 2), "V5:-1.50"),
        (Decimal("1E-20"), decimal_type(38, 20), "V22:0.00000000000000000001"),
        (Decimal("0E-2"), decimal_type(10, 2), "V4:0.00"),
        (b"\x00\xff", BINARY, "V4:00ff"),
        (19723, DATE, "V5:19723"),
        (-62135596800000000, TIMESTAMP, "V18:-62135596800000000"),
        (1.5, FLOAT, "V7:0x1.8p0"),
        ([1, None, 3], array_of(LONG), "A3:V1:1NV1:3"),
        ([], array_of(STRING), "A0:"),
        ([None], array_of(STRING), "A1:N"),
        ([""], array_of(STRING), "A1:V0:"),
        ({"b": "2", "a": None, "é": "x"}, STRING_MAP, "M3:V1:aNV1:bV1:2V1:éV1:x"),
        ({"x": 1.5, "y": -0.0}, POINT, "S2:V7:0x1.8p0V8:-0x0.0p0"),
    ],
)  # fmt: skip
def test_tokens_are_length_prefixed_and_null_is_not_empty(
    value: object, silver: SilverType, expected: str
) -> None:
    assert token(value, silver) == expected


def test_no_split_of_values_can_imitate_another() -> None:
    rows = [["ab", "c"], ["a", "bc"], ["abc", None], ["abc", ""], ["V1:a", None]]
    texts = {row_text([token(v, STRING) for v in row]) for row in rows}
    assert len(texts) == len(rows)
    assert raw_token("NaN") != token("NaN", STRING)


def test_row_hashes_are_the_first_60_bits_of_md5_as_both_engines_compute_them() -> None:
    # Spark: conv(substr(md5('x'), 1, 15), 16, 10); PostgreSQL: ('x' || substr(md5('x'), 1, 15))::bit(60)::bigint
    assert hash60("x") == 710810379057940483
    assert hash60("é") == int("66ddcd97cfdeabb", 16)
    assert all(0 <= hash60(str(i)) < 2**60 for i in range(100))


@pytest.mark.parametrize(
    ("pg", "modes", "form"),
    [
        (ColumnType("int4", "b", -1, False), TypeModes(), PgForm.INTEGER),
        (numeric(10, 2), TypeModes(), PgForm.NUMERIC),
        (numeric(38, -2), TypeModes(), PgForm.TEXT),  # decimal(40,0) does not exist
        (numeric(3, 5), TypeModes(), PgForm.NUMERIC),
        (ColumnType("numeric", "b", -1, False), TypeModes(), PgForm.TEXT),
        (numeric(10, 2), TypeModes(decimal="double"), PgForm.NUMERIC_FLOAT),
        (numeric(10, 2), TypeModes(decimal="string"), PgForm.TEXT),
        (ColumnType("money", "b", -1, False), TypeModes(decimal="double"), PgForm.NUMERIC_FLOAT),
        (ColumnType("time", "b", 3, False), TypeModes(), PgForm.TIME_MS),
        (ColumnType("time", "b", -1, False), TypeModes(), PgForm.TIME_US),
        (ColumnType("time", "b", 6, False), TypeModes(time_precision="connect"), PgForm.TIME_MS),
        (ColumnType("time", "b", 3, False), TypeModes(time_precision="nanoseconds"),
         PgForm.TIME_NS),
        (ColumnType("timetz", "b", -1, False), TypeModes(time_precision="nanoseconds"),
         PgForm.TEXT),
        (ColumnType("interval", "b", -1, False), TypeModes(interval="numeric"), PgForm.INTERVAL_US),
        (ColumnType("bytea", "b", -1, False), TypeModes(binary="hex"), PgForm.BYTEA_HEX),
        (ColumnType("bit", "b", 1, False), TypeModes(), PgForm.BIT1),
        (ColumnType("bit", "b", 3, False), TypeModes(), PgForm.TEXT),
        (ColumnType("int4", "e", -1, False), TypeModes(), PgForm.TEXT),  # an enum named int4
        (ColumnType("date", "b", -1, True), TypeModes(), PgForm.DATE),  # elements of date[]
    ],
)  # fmt: skip
def test_each_column_gets_the_form_of_the_type_mapping(
    pg: ColumnType, modes: TypeModes, form: PgForm
) -> None:
    assert pg_form(pg, modes) is form
    string_forms = {PgForm.TEXT, PgForm.BYTEA_BASE64, PgForm.BYTEA_BASE64_URL, PgForm.HSTORE_JSON}
    element = silver_type(pg, modes)
    element = element.element if pg.array and element.element else element
    assert (element.name == "string") == (form in string_forms or pg.name == "bytea")


def test_the_one_transform_the_reader_applies_is_repeated_and_a_hash_is_cut_to_length() -> None:
    """Of the rules matching a column, the reader applies one: a mask, a v1 hash, a v2 hash,
    then a truncation (`Rule.rank`); chaining them would call a right mirror wrong."""
    varchar8 = ColumnType("varchar", "b", 8 + 4, False)
    rules = [
        Rule.parse("column.truncate.to.3.chars", r"public\.t\.c"),
        Rule.parse("column.mask.hash.v2.SHA-256.with.salt.s", "public.t.c"),
        Rule.parse("column.mask.with.2.chars", "public.t.other"),
    ]
    steps, why_not = text_steps(rules, "public.t.c", varchar8)
    assert why_not is None
    assert len(steps) == 1
    assert apply_steps(steps, "héllo") == "bb2e21b2"  # sha256(b"s" + "héllo".encode()), 8 chars
    assert text_steps(rules, "public.t.c", ColumnType("int4", "b", -1, False)) == ((), None)
    masked, _ = text_steps(rules, "public.t.other", varchar8)
    assert apply_steps(masked, "secret") == "**"


def test_a_hash_postgresql_has_no_function_for_is_named_instead_of_compared() -> None:
    text = ColumnType("text", "b", -1, False)
    for key in ("column.mask.hash.SHA-256.with.salt.s", "column.mask.hash.v2.SHA3-256.with.salt.s"):
        steps, why_not = text_steps([Rule.parse(key, "public.t.c")], "public.t.c", text)
        assert steps == ()
        assert why_not == f"{key} (PostgreSQL cannot repeat this hash)"
