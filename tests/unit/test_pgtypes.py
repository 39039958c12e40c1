"""pgtypes maps every PostgreSQL type to its silver type and converts literal text vectors exactly."""

from __future__ import annotations

import ast
import math
import struct
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import cdc_core.pgtypes
from cdc_core.pgtypes import ColumnType, SilverType, TypeModes, Unrepresentable, converter
from cdc_core.pgtypes import silver_type as silver
from cdc_core.pgtypes.containers import parse_array
from cdc_core.pgtypes.temporal import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US, py310_isoformat

STRING, LONG, INT = SilverType("string"), SilverType("long"), SilverType("int")
DOUBLE = SilverType("double")


def numeric(p: int, s: int) -> int:
    """The typmod of numeric(p,s), as PostgreSQL packs it."""
    return ((p << 16) | (s & 0x7FF)) + 4


def col(name: str, modifier: int = -1, *, kind: str = "b", array: bool = False) -> ColumnType:
    return ColumnType(name, kind, modifier, array)


def convert(t: ColumnType | str, text: str, **modes: Any) -> object:
    column = col(t) if isinstance(t, str) else t
    return converter(column, TypeModes(**modes))(text)


def decimal_type(p: int, s: int) -> SilverType:
    return SilverType("decimal", precision=p, scale=s)


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


# --- the mapping table -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        (col("bool"), SilverType("boolean")),
        (col("bit", 1), SilverType("boolean")),
        (col("bit", 3), STRING),
        (col("varbit", 1), STRING),
        (col("int2"), SilverType("short")),
        (col("int4"), INT),
        (col("int8"), LONG),
        (col("oid"), LONG),
        (col("xid"), LONG),
        (col("cid"), LONG),
        (col("xid8"), decimal_type(20, 0)),
        (col("numeric", numeric(12, 2)), decimal_type(12, 2)),
        (col("numeric", numeric(38, 38)), decimal_type(38, 38)),
        (col("numeric", numeric(3, -2)), decimal_type(5, 0)),
        (col("numeric", numeric(2, 4)), decimal_type(4, 4)),
        (col("numeric", numeric(39, 2)), STRING),
        (col("numeric", numeric(37, -2)), STRING),
        (col("numeric"), STRING),
        (col("float4"), SilverType("float")),
        (col("float8"), DOUBLE),
        (col("money"), decimal_type(19, 2)),
        (col("bytea"), SilverType("binary")),
        (col("date"), SilverType("date")),
        (col("timestamp", 3), SilverType("timestamp_ntz")),
        (col("timestamptz"), SilverType("timestamp")),
        (col("time", 0), INT),
        (col("time", 3), INT),
        (col("time", 4), LONG),
        (col("time"), LONG),
        (col("timetz", 3), STRING),
        (col("interval"), STRING),
        (col("point"), SilverType("struct", fields=(("x", DOUBLE), ("y", DOUBLE)))),
        (col("hstore"), STRING),
        (col("int4", array=True), SilverType("array", element=INT)),
        (
            col("numeric", numeric(5, 2), array=True),
            SilverType("array", element=decimal_type(5, 2)),
        ),
    ]
    + [
        (col(name), STRING)
        for name in (
            *("text", "varchar", "bpchar", "char", "name", "citext", "uuid", "json", "jsonb"),
            *("xml", "inet", "cidr", "macaddr", "macaddr8", "tsvector", "tsquery", "pg_lsn"),
            *("line", "lseg", "box", "path", "polygon", "circle", "ltree", "regclass"),
            *("int2vector", "some_extension_type"),
        )
    ]
    + [(col("int4", kind=k), STRING) for k in ("e", "c", "r", "m", "d", "p")],
)
def test_each_postgresql_type_has_its_silver_type(column: ColumnType, expected: SilverType) -> None:
    assert silver(column) == expected


@pytest.mark.parametrize(
    ("column", "modes", "expected"),
    [
        (col("numeric", numeric(12, 2)), {"decimal": "double"}, DOUBLE),
        (col("numeric"), {"decimal": "double"}, DOUBLE),
        (col("numeric", numeric(12, 2)), {"decimal": "string"}, STRING),
        (col("money"), {"decimal": "double"}, DOUBLE),
        (col("money"), {"decimal": "string"}, STRING),
        (col("time", 3), {"time_precision": "adaptive_time_microseconds"}, LONG),
        (col("time", 3), {"time_precision": "microseconds"}, LONG),
        (col("time", 6), {"time_precision": "connect"}, INT),
        (col("time", 6), {"time_precision": "isostring"}, STRING),
        (col("time", 0), {"time_precision": "nanoseconds"}, LONG),
        (col("time"), {"time_precision": "nanoseconds"}, LONG),
        (col("timetz"), {"time_precision": "nanoseconds"}, STRING),
        (col("timestamp"), {"time_precision": "nanoseconds"}, SilverType("timestamp_ntz")),
        (col("timestamptz"), {"time_precision": "nanoseconds"}, SilverType("timestamp")),
        (col("timestamp"), {"time_precision": "isostring"}, SilverType("timestamp_ntz")),
        (col("date"), {"time_precision": "connect"}, SilverType("date")),
        (col("interval"), {"interval": "numeric"}, LONG),
        (col("bytea"), {"binary": "base64"}, STRING),
        (col("bytea"), {"binary": "hex"}, STRING),
        (col("hstore"), {"hstore": "map"}, SilverType("map", element=STRING)),
        (
            col("hstore", array=True),
            {"hstore": "map"},
            SilverType("array", element=SilverType("map", element=STRING)),
        ),
    ],
)
def test_modes_change_the_silver_type(
    column: ColumnType, modes: dict[str, Any], expected: SilverType
) -> None:
    assert silver(column, TypeModes(**modes)) == expected


@pytest.mark.parametrize(
    ("column", "type_oid", "unknown"),
    [
        (ColumnType("cube", "b", -1, False), 16500, True),  # an extension's base type
        (ColumnType("cube", "b", -1, True), 16501, True),  # its array
        (ColumnType("ltree", "b", -1, False), 16600, False),  # an extension the mapping names
        (ColumnType("hstore", "b", -1, False), 16700, False),
        (ColumnType("uuid", "b", -1, False), 16800, False),  # a domain over a built-in type
        (ColumnType("mood", "e", -1, False), 16900, False),  # enums are text by design
        (ColumnType("gtsvector", "b", -1, False), 3642, False),  # built in, whatever its name
    ],
)
def test_only_extension_types_the_mapping_does_not_know_are_unknown(
    column: ColumnType, type_oid: int, unknown: bool
) -> None:
    assert cdc_core.pgtypes.is_unknown(column, type_oid) is unknown
    assert silver(column).name in ("string", "array")


def test_an_unknown_mode_value_is_rejected_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="decimal: 'exact' is not one of precise, double, string"):
        TypeModes(decimal="exact")  # type: ignore[arg-type]


def test_pgtypes_imports_only_the_standard_library() -> None:
    package = Path(cdc_core.pgtypes.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in ("pyspark", "psycopg", "pyarrow"), source


# --- integers, floats, numeric, money, bool --------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("int2", "-32768", -32768),
        ("int2", "32767", 32767),
        ("int4", "-2147483648", -(2**31)),
        ("int4", "2147483647", 2**31 - 1),
        ("int8", "-9223372036854775808", -(2**63)),
        ("int8", "9223372036854775807", 2**63 - 1),
        ("oid", "4294967295", 2**32 - 1),
        ("xid", "4294967295", 2**32 - 1),
        ("cid", "0", 0),
        ("xid8", "18446744073709551615", Decimal(2**64 - 1)),
        ("bool", "t", True),
        ("bool", "f", False),
        ("bool", "true", True),  # a ::text cast prints true/false, the output function t/f
        ("bool", "false", False),
    ],
)
def test_integers_and_booleans_convert_exactly(name: str, text: str, value: object) -> None:
    assert convert(name, text) == value


def test_garbage_boolean_is_a_value_error_not_unrepresentable() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL boolean") as e:
        convert("bool", "yes")
    assert not isinstance(e.value, Unrepresentable)


@pytest.mark.parametrize(
    ("p", "s", "text", "value"),
    [
        (10, 2, "12.3", "12.30"),
        (5, 2, "1.50", "1.50"),
        (5, 2, "-999.99", "-999.99"),
        (5, 2, "0.00", "0.00"),
        (38, 0, "9" * 38, "9" * 38),
        (38, 38, "0." + "9" * 38, "0." + "9" * 38),
        (3, -2, "12300", "12300"),
        (2, 4, "0.0012", "0.0012"),
        (10, 0, "-42", "-42"),
    ],
)
def test_numeric_becomes_a_decimal_with_the_column_scale(
    p: int, s: int, text: str, value: str
) -> None:
    result = convert(col("numeric", numeric(p, s)), text)
    assert isinstance(result, Decimal)
    assert str(result) == value
    assert result.as_tuple().exponent == -max(s, 0)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1.234", "123456.00", "1234.5"])
def test_numeric_that_a_decimal_cannot_hold_exactly_is_unrepresentable(text: str) -> None:
    with pytest.raises(Unrepresentable):
        convert(col("numeric", numeric(5, 2)), text)


def test_unconstrained_and_wide_numeric_keep_their_exact_text() -> None:
    thousand_digits = "1" * 600 + "." + "2" * 400
    assert convert("numeric", thousand_digits) == thousand_digits
    assert convert("numeric", "NaN") == "NaN"
    assert convert(col("numeric", numeric(39, 1)), "12.0") == "12.0"
    assert convert(col("numeric", numeric(5, 2)), "NaN", decimal="string") == "NaN"


def test_numeric_in_double_mode_is_a_float_with_nan_and_infinities() -> None:
    column = col("numeric", numeric(12, 2))
    assert convert(column, "1.25", decimal="double") == 1.25
    assert math.isnan(convert(column, "NaN", decimal="double"))  # type: ignore[arg-type]
    assert convert("numeric", "-Infinity", decimal="double") == -math.inf


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.5", 1.5),
        ("NaN", math.nan),
        ("Infinity", math.inf),
        ("-Infinity", -math.inf),
        ("1.7976931348623157e+308", 1.7976931348623157e308),
        ("5e-324", 5e-324),
        ("0.1", 0.1),
    ],
)
def test_float8_text_round_trips(text: str, value: float) -> None:
    result = convert("float8", text)
    assert result == value or (math.isnan(value) and math.isnan(result))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.1", f32(0.1)),
        ("3.4028235e+38", f32(3.4028234663852886e38)),
        ("1e-45", 2.0**-149),
        ("-Infinity", -math.inf),
        ("1.2345678", f32(1.2345678)),
        # Parsed as a double this lands exactly halfway between 1 and 1 + 2^-23 (rounding to
        # even would give 1); the text is above the halfway point, so the answer is 1 + 2^-23.
        ("1.0000000596046447753906251", 1 + 2.0**-23),
        ("1.0000000596046447753906249", 1.0),
    ],
)
def test_float4_is_exactly_the_float32_value(text: str, value: float) -> None:
    assert convert("float4", text) == value


def test_negative_zero_keeps_its_sign() -> None:
    for name in ("float4", "float8"):
        assert math.copysign(1.0, convert(name, "-0")) == -1.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("$0.00", "0.00"),
        ("$1,234.56", "1234.56"),
        ("-$1,234.56", "-1234.56"),
        ("$92,233,720,368,547,758.07", "92233720368547758.07"),
        ("-$92,233,720,368,547,758.08", "-92233720368547758.08"),
    ],
)
def test_money_is_an_exact_decimal(text: str, value: str) -> None:
    result = convert("money", text)
    assert isinstance(result, Decimal)
    assert str(result) == value
    assert convert("money", text, decimal="string") == value
    assert convert("money", text, decimal="double") == float(value)


@pytest.mark.parametrize(
    ("digits", "text", "value"),
    [
        (0, "$1.50", "2"),  # half up: away from zero, as Debezium's setScale(n, HALF_UP)
        (0, "-$1.50", "-2"),
        (0, "$0.49", "0"),
        (1, "$0.05", "0.1"),
        (1, "-$0.05", "-0.1"),
        (4, "$1,234.56", "1234.5600"),
        (0, "$92,233,720,368,547,758.07", "92233720368547758"),
        (0, "-$92,233,720,368,547,758.08", "-92233720368547758"),
        (21, "-$92,233,720,368,547,758.08", "-92233720368547758.080000000000000000000"),
    ],
)
def test_money_takes_money_fraction_digits_in_precise_mode(
    digits: int, text: str, value: str
) -> None:
    assert silver(col("money"), TypeModes(money_fraction_digits=digits)) == decimal_type(
        17 + digits, digits
    )
    result = convert("money", text, money_fraction_digits=digits)
    assert isinstance(result, Decimal)
    assert str(result) == value
    # Debezium's double and string modes do not use the digits
    assert convert("money", text, decimal="string", money_fraction_digits=digits) == str(
        convert("money", text)
    )
    assert convert("money", text, decimal="double", money_fraction_digits=digits) == float(
        convert("money", text)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("digits", [-1, 22])
def test_money_fraction_digits_must_fit_a_spark_decimal(digits: int) -> None:
    with pytest.raises(ValueError, match="money_fraction_digits"):
        TypeModes(money_fraction_digits=digits)


def test_money_arrays_take_the_digits_too() -> None:
    money_array = col("money", array=True)
    modes = TypeModes(money_fraction_digits=0)
    assert silver(money_array, modes) == SilverType("array", element=decimal_type(17, 0))
    assert converter(money_array, modes)('{"$1.50",NULL}') == [Decimal(2), None]


# --- strings, binary, bits, point ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bpchar", "x  "),
        ("varchar", ""),
        ("text", "ünïcödé ✓ 😀 \t\n\\"),
        ("char", "a"),
        ("name", "pg_class"),
        ("citext", "MiXeD"),
        ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("jsonb", '{"a": [1, 2.5, null]}'),
        ("timetz", "04:05:06.789+05:30"),
        ("interval", "P1Y2M3DT4H5M6.78S"),
        ("bit", "101"),
        ("text", "x" * 1_000_000),
    ],
)
def test_text_types_keep_the_exact_text(name: str, text: str) -> None:
    assert convert(name, text) == text


@pytest.mark.parametrize(
    ("mode", "text", "value"),
    [
        ("bytes", "\\x00ff", b"\x00\xff"),
        ("bytes", "\\x", b""),
        ("base64", "\\xfbff", "+/8="),
        ("base64-url-safe", "\\xfbff", "-_8="),
        ("hex", "\\x00ff", "00ff"),
    ],
)
def test_bytea_follows_the_binary_mode(mode: str, text: str, value: object) -> None:
    assert convert("bytea", text, binary=mode) == value


def test_bytea_in_escape_form_is_refused() -> None:
    with pytest.raises(ValueError, match="bytea_output=hex"):
        convert("bytea", "abc\\000")


def test_bit_1_is_a_boolean() -> None:
    assert convert(col("bit", 1), "1") is True
    assert convert(col("bit", 1), "0") is False


def test_point_is_a_struct_of_doubles() -> None:
    assert convert("point", "(1.5,2)") == {"x": 1.5, "y": 2.0}
    assert convert("point", "(-Infinity,1e-300)") == {"x": -math.inf, "y": 1e-300}


# --- dates, timestamps, times, intervals -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "days"),
    [("1970-01-01", 0), ("2017-09-15", 17424), ("0001-01-01", -719162), ("9999-12-31", 2932896)],
)
def test_date_is_days_since_the_epoch(text: str, days: int) -> None:
    assert convert("date", text) == days


@pytest.mark.parametrize("name", ["date", "timestamp", "timestamptz"])
@pytest.mark.parametrize("text", ["infinity", "-infinity"])
def test_infinite_dates_and_timestamps_are_unrepresentable(name: str, text: str) -> None:
    with pytest.raises(Unrepresentable):
        convert(name, text)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("date", "0044-03-15 BC"),
        ("date", "10000-01-01"),
        ("timestamp", "0044-03-15 07:23:45 BC"),
        ("timestamp", "10000-01-01 00:00:00"),
        ("timestamptz", "0044-03-15 07:23:45+00 BC"),
        ("timestamptz", "10000-01-01 00:00:00+00"),
        ("timestamptz", "0001-01-01 00:30:00+01"),
        ("timestamptz", "9999-12-31 23:30:00-01"),
    ],
)
def test_dates_outside_years_1_to_9999_are_unrepresentable(name: str, text: str) -> None:
    with pytest.raises(Unrepresentable, match=r"outside 0001-01-01\.\.9999-12-31"):
        convert(name, text)


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("2018-06-20 15:13:16.945104", 1529507596945104),
        ("1970-01-01 00:00:00", 0),
        ("1969-12-31 23:59:59.5", -500_000),
        ("0001-01-01 00:00:00", MIN_TIMESTAMP_US),
        ("9999-12-31 23:59:59.999999", MAX_TIMESTAMP_US),
    ],
)
def test_timestamp_is_wall_clock_micros(text: str, micros: int) -> None:
    assert convert("timestamp", text) == micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("2021-06-05 07:23:45.594904+00", 1622877825594904),
        ("2021-06-05 13:23:45.594904+06", 1622877825594904),
        ("2021-06-05 12:53:45.594904+05:30", 1622877825594904),
        ("2021-06-05 03:53:45.594904-03:30", 1622877825594904),
        ("1900-01-01 12:00:00+00:19:32", -2208945600_000000 - 1172_000000),
        ("1970-01-01 00:00:00.1+00", 100_000),
        ("0001-01-01 00:00:00+00", MIN_TIMESTAMP_US),
        ("9999-12-31 23:59:59.999999+00", MAX_TIMESTAMP_US),
    ],
)
def test_timestamptz_is_micros_of_the_utc_instant(text: str, micros: int) -> None:
    assert convert("timestamptz", text) == micros


def test_a_timestamp_with_an_offset_and_a_timestamptz_without_are_refused() -> None:
    with pytest.raises(ValueError, match="UTC offset"):
        convert("timestamp", "2021-06-05 07:23:45+00")
    with pytest.raises(ValueError, match="UTC offset"):
        convert("timestamptz", "2021-06-05 07:23:45.594904")


@pytest.mark.parametrize(
    ("text", "end", "normal"),
    [
        ("2021-06-05 07:23:45.5+00", 19, "2021-06-05 07:23:45.500000+00:00"),
        ("2021-06-05 07:23:45+05:30", 19, "2021-06-05 07:23:45+05:30"),
        ("2021-06-05 07:23:45.123", 19, "2021-06-05 07:23:45.123000"),
        ("04:05:06.7", 8, "04:05:06.700000"),
    ],
)
def test_python_310_gets_iso_text_it_accepts(text: str, end: int, normal: str) -> None:
    assert py310_isoformat(text, end) == normal
    assert datetime.fromisoformat("2000-01-01 " + normal if end == 8 else normal)


@pytest.mark.parametrize(
    ("modifier", "modes", "text", "value"),
    [
        (3, {}, "04:05:11.789", 14_711_789),
        (0, {}, "04:05:11", 14_711_000),
        (6, {}, "04:05:11.789012", 14_711_789_012),
        (-1, {}, "24:00:00", 86_400_000_000),
        (3, {}, "24:00:00", 86_400_000),
        (3, {"time_precision": "microseconds"}, "04:05:11.789", 14_711_789_000),
        (2, {"time_precision": "adaptive_time_microseconds"}, "00:00:00.01", 10_000),
        (6, {"time_precision": "connect"}, "04:05:11.789999", 14_711_789),
        (-1, {"time_precision": "isostring"}, "04:05:11.789", "04:05:11.789"),
    ],
)
def test_time_follows_the_time_precision_mode(
    modifier: int, modes: dict[str, Any], text: str, value: object
) -> None:
    assert convert(col("time", modifier), text, **modes) == value


@pytest.mark.parametrize(
    ("modifier", "text", "nanos"),
    [
        (-1, "00:00:00", 0),
        (-1, "00:00:00.000001", 1_000),
        (6, "23:59:59.999999", 86_399_999_999_000),
        (-1, "24:00:00", 86_400_000_000_000),  # PostgreSQL allows the end of the day
        (0, "04:05:11", 14_711_000_000_000),
        (3, "04:05:11.789", 14_711_789_000_000),  # no milliseconds: adaptive does not apply
    ],
)
def test_nanoseconds_mode_gives_exact_nanoseconds_past_midnight(
    modifier: int, text: str, nanos: int
) -> None:
    assert convert(col("time", modifier), text, time_precision="nanoseconds") == nanos


def test_nanoseconds_mode_keeps_null_elements_and_timetz_text() -> None:
    times = col("time", array=True)
    assert convert(times, "{00:00:00,NULL,24:00:00}", time_precision="nanoseconds") == [
        0, None, 86_400_000_000_000
    ]  # fmt: skip
    assert convert("timetz", "04:05:11.789+02", time_precision="nanoseconds") == "04:05:11.789+02"


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("P1Y2M3DT4H5M6.78S", 37_091_106_780_000),
        ("P-1Y-2M3DT-4H-5M-6.78S", -36_572_706_780_000),
        ("PT0S", 0),
        ("PT-0.5S", -500_000),
        ("P1M", 2_629_800_000_000),
        ("P1Y", 12 * 2_629_800_000_000),
        ("P-3D", -3 * 86_400_000_000),
        ("PT1000000H", 3_600_000_000_000_000),
        ("PT0.000001S", 1),
    ],
)
def test_interval_numeric_mode_is_debeziums_approximation(text: str, micros: int) -> None:
    assert convert("interval", text, interval="numeric") == micros


def test_interval_beyond_a_long_of_micros_is_unrepresentable() -> None:
    with pytest.raises(Unrepresentable, match="overflows"):
        convert("interval", "P178000000Y", interval="numeric")
    with pytest.raises(Unrepresentable):
        convert("interval", "infinity", interval="numeric")


# --- hstore ----------------------------------------------------------------------------

HSTORE = '""=>"", "a"=>"1", "b c"=>NULL, "q\\"uote"=>"x", "back\\\\slash"=>"v\\\\", "é"=>"ü"'
HSTORE_MAP = {"": "", "a": "1", "b c": None, 'q"uote': "x", "back\\slash": "v\\", "é": "ü"}


def test_hstore_map_mode_parses_escapes_and_nulls() -> None:
    assert convert("hstore", HSTORE, hstore="map") == HSTORE_MAP
    assert convert("hstore", "", hstore="map") == {}


def test_hstore_json_mode_is_a_compact_json_object() -> None:
    assert convert("hstore", '"a"=>"1", "b"=>NULL') == '{"a":"1","b":null}'
    assert convert("hstore", HSTORE) == (
        '{"":"","a":"1","b c":null,"q\\"uote":"x","back\\\\slash":"v\\\\","é":"ü"}'
    )


@pytest.mark.parametrize("text", ['"a"=>1', '"a"=>"1",', '"a"=>"1", ', '"a"=>"1" "b"=>"2"', '"a'])
def test_malformed_hstore_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not hstore"):
        convert("hstore", text)


# --- arrays ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "text", "value"),
    [
        (col("int4", array=True), "{1,2,NULL}", [1, 2, None]),
        (col("int4", array=True), "{}", []),
        (col("text", array=True), '{"a b","c\\"d",NULL,"NULL"}', ["a b", 'c"d', None, "NULL"]),
        (col("text", array=True), '{"","x\\\\y","{}",","}', ["", "x\\y", "{}", ","]),
        (col("text", array=True), "{NULL,NULL}", [None, None]),
        (col("text", array=True), "{é,😀}", ["é", "😀"]),
        (col("bytea", array=True), '{"\\\\x00ff",NULL}', [b"\x00\xff", None]),
        (col("point", array=True), '{"(1,2)"}', [{"x": 1.0, "y": 2.0}]),
        (col("box", array=True), "{(1,2),(0,0);(3,4),(1,1)}", ["(1,2),(0,0)", "(3,4),(1,1)"]),
        (col("pair", kind="c", array=True), '{"(1,\\"a b\\")",NULL}', ['(1,"a b")', None]),
        (col("int4range", kind="r", array=True), '{"[1,3)",empty}', ["[1,3)", "empty"]),
        (col("date", array=True), "{1970-01-02,NULL}", [1, None]),
        (
            col("numeric", numeric(5, 2), array=True),
            "{1.50,-2.00}",
            [Decimal("1.50"), Decimal("-2.00")],
        ),
        (col("bool", array=True), "{t,f}", [True, False]),
        (col("hstore", array=True), '{"\\"a\\"=>\\"b,}\\""}', ['{"a":"b,}"}']),
    ],
)
def test_arrays_parse_postgresql_array_text_exactly(
    column: ColumnType, text: str, value: list[object]
) -> None:
    assert converter(column)(text) == value


def test_nested_array_text_parses_into_nested_lists() -> None:
    assert parse_array("{{1,2},{3,4}}", int) == [[1, 2], [3, 4]]
    assert parse_array('{{"a b",NULL},{c,"}"}}', str) == [["a b", None], ["c", "}"]]
    assert parse_array("{{{1}},{{2}}}", int) == [[[1]], [[2]]]


@pytest.mark.parametrize(
    ("column", "text", "why"),
    [
        (col("int4", array=True), "[2:3]={1,2}", "lower bound"),
        (col("int4", array=True), "[0:1][1:1]={{1},{2}}", "lower bound"),
        (col("int4", array=True), "{{1,2},{3,4}}", "more than one dimension"),
        (col("text", array=True), '{{"a b"},{c}}', "more than one dimension"),
        (col("numeric", numeric(5, 2), array=True), "{1.00,NaN}", "decimal"),
        (col("date", array=True), "{2020-01-01,infinity}", "outside"),
    ],
)
def test_arrays_spark_cannot_hold_are_unrepresentable(
    column: ColumnType, text: str, why: str
) -> None:
    with pytest.raises(Unrepresentable, match=why):
        converter(column)(text)


@pytest.mark.parametrize(
    "text", ["", "1,2", "{1,2", '{"a}', "{1}}", "{{1},2}x", '{"a"b}', "{1,}", "{,1}", '{"a",}']
)
def test_malformed_array_text_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL array"):
        converter(col("text", array=True))(text)
