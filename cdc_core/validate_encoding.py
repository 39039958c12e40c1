"""`cdc validate`'s canonical row encoding: one text per row that PostgreSQL and Spark both build.

A value becomes a token; a row is its tokens concatenated in column order; a row's hash is the
first 60 bits of the MD5 of that text (UTF-8). Tokens are length-prefixed, so no value can
imitate a boundary, and NULL is never the empty string:

| token | meaning |
|---|---|
| `N` | SQL NULL |
| `V<n>:<payload>` | a value; n = the payload's length in characters (code points) |
| `A<n>:<tokens>` | an array of n elements, each a token (`N` for a NULL element) |
| `M<n>:<tokens>` | a map (hstore in map mode): key and value tokens, sorted by key bytes |
| `S<n>:<tokens>` | a struct (point): its n field tokens in order |
| `R<n>:<text>` | a value the silver type cannot hold: PostgreSQL's exact text (`_cdc_raw`) |
| `U` | silver never saw the value (an unchanged TOAST value, `_cdc_unavailable`) |
| `X` | silver holds a typed value and `_cdc_raw` text for one column (the typed one must be NULL) |

Payloads are chosen so that both engines compute them exactly from what they hold:

- boolean: `t` or `f`;
- short, int, long, decimal(p,s): plain decimal text (`-12.50`: exactly s fraction digits);
- float, double: the value as a double in Java's hexadecimal form (`0x1.8p1`, `-0x0.0p0`,
  `NaN`, `Infinity`), which keeps every bit; every NaN is one NaN;
- string: the string itself (PostgreSQL's output text of json, uuid, enums, ...);
- binary: lower-case hex of the bytes;
- date: days since 1970-01-01;
- timestamp, timestamp_ntz: microseconds since 1970-01-01T00:00 (UTC; wall clock for
  timestamp_ntz).

`U` never matches a source value: a mirror that lacks a value is not equal to its source; nor
does `X`: users read the typed column, so a value there that the raw text hides is a difference.
`R` tokens carry the exact text on both sides, so out-of-range dates, numeric NaN and arrays
with other lower bounds are compared exactly too. The Python reference below (`token`) is what
the unit tests hold both engines to.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum

from cdc_core.columns import ALGORITHMS, CHARACTER_TYPES, Rule
from cdc_core.pgtypes import ColumnType, SilverType, TypeModes
from cdc_core.pgtypes.scalars import MAX_DECIMAL_PRECISION, decimal_shape, numeric_typmod

HASH_BITS = 60
"""Row and key hashes are the first 60 bits of an MD5: they fit a signed 64-bit integer."""
NULL = "N"
SHOWN_CHARS = 120
"""Characters of a value shown in a report."""
UNAVAILABLE = "U"
TWICE = "X"
"""The token of a silver column holding both a typed value and `_cdc_raw` text."""
_MANTISSA = (1 << 52) - 1
_PG_HASHES = {"MD5": "md5", "SHA-224": "sha224", "SHA-256": "sha256", "SHA-384": "sha384",
              "SHA-512": "sha512"}  # fmt: skip
"""Debezium's hash algorithms that PostgreSQL has built in (`md5(bytea)`, `sha256(bytea)`, ...)."""


class PgForm(Enum):
    """How PostgreSQL computes a column's payload: one per way the type mapping types it."""

    TEXT = "text"  # the output function's text, concat(x)
    BOOL = "bool"
    BIT1 = "bit1"
    INTEGER = "integer"  # x::text
    NUMERIC = "numeric"  # x::text; NaN and infinities are kept raw
    MONEY = "money"  # x::numeric::text
    FLOAT = "float"  # x::float8 in Java's hex form
    NUMERIC_FLOAT = "numeric_float"  # x::numeric as a float8, as Java's doubleValue rounds it
    DATE = "date"
    TIMESTAMP = "timestamp"  # µs; infinite, BC and years past 9999 kept raw
    TIMESTAMPTZ = "timestamptz"
    TIME_US = "time_us"
    TIME_MS = "time_ms"
    TIME_NS = "time_ns"
    INTERVAL_US = "interval_us"  # Debezium's µs (a month is 30.4375 days); overflow kept raw
    BYTEA_HEX = "bytea_hex"  # binary (as bytes or as hex text)
    BYTEA_BASE64 = "bytea_base64"
    BYTEA_BASE64_URL = "bytea_base64_url"
    HSTORE_JSON = "hstore_json"
    HSTORE_MAP = "hstore_map"
    POINT = "point"


RAW_FORMS = frozenset(
    {PgForm.NUMERIC, PgForm.DATE, PgForm.TIMESTAMP, PgForm.TIMESTAMPTZ, PgForm.INTERVAL_US}
)
"""Forms whose values the silver type may be unable to hold (then `_cdc_raw` keeps the text)."""

_FIXED = {
    "bool": PgForm.BOOL, "int2": PgForm.INTEGER, "int4": PgForm.INTEGER, "int8": PgForm.INTEGER,
    "oid": PgForm.INTEGER, "xid": PgForm.INTEGER, "cid": PgForm.INTEGER, "xid8": PgForm.INTEGER,
    "float4": PgForm.FLOAT, "float8": PgForm.FLOAT, "date": PgForm.DATE,
    "timestamp": PgForm.TIMESTAMP, "timestamptz": PgForm.TIMESTAMPTZ, "point": PgForm.POINT,
}  # fmt: skip
_BYTEA = {"bytes": PgForm.BYTEA_HEX, "hex": PgForm.BYTEA_HEX, "base64": PgForm.BYTEA_BASE64,
          "base64-url-safe": PgForm.BYTEA_BASE64_URL}  # fmt: skip


def pg_form(t: ColumnType, modes: TypeModes) -> PgForm:
    """The payload form of a column (of its elements, for an array), following the type
    mapping (`cdc_core.pgtypes.mapping`) case by case."""
    if t.kind != "b":
        return PgForm.TEXT
    fixed = _FIXED.get(t.name)
    if fixed is not None:
        return fixed
    if t.name == "numeric":
        if modes.decimal == "double":
            return PgForm.NUMERIC_FLOAT
        if modes.decimal == "string" or numeric_typmod(t.modifier) is None:
            return PgForm.TEXT
        precision, _ = decimal_shape(*(numeric_typmod(t.modifier) or (0, 0)))
        return PgForm.NUMERIC if precision <= MAX_DECIMAL_PRECISION else PgForm.TEXT
    if t.name == "money":
        return PgForm.NUMERIC_FLOAT if modes.decimal == "double" else PgForm.MONEY
    if t.name == "time":
        return _time_form(t.modifier, modes)
    if t.name == "interval":
        return PgForm.TEXT if modes.interval == "string" else PgForm.INTERVAL_US
    if t.name == "bytea":
        return _BYTEA[modes.binary]
    if t.name == "hstore":
        return PgForm.HSTORE_JSON if modes.hstore == "json" else PgForm.HSTORE_MAP
    if t.name == "bit" and t.modifier == 1:
        return PgForm.BIT1
    return PgForm.TEXT


def _time_form(modifier: int, modes: TypeModes) -> PgForm:
    """As the mapping's `_time`: text, int ms, long ns or long µs by time.precision.mode."""
    mode = modes.time_precision
    if mode == "isostring":
        return PgForm.TEXT
    if mode == "connect" or (mode == "adaptive" and 0 <= modifier <= 3):
        return PgForm.TIME_MS
    return PgForm.TIME_NS if mode == "nanoseconds" else PgForm.TIME_US


def money_digits(modes: TypeModes) -> int:
    """The fraction digits silver gives money: money.fraction.digits in precise mode; the
    double and string modes keep PostgreSQL's two (lc_monetary=C)."""
    return modes.money_fraction_digits if modes.decimal == "precise" else 2


@dataclass(frozen=True)
class TextStep:
    """One Debezium column transform, as PostgreSQL can repeat it on the source text."""

    kind: str  # truncate | mask | hash
    length: int = 0  # truncate, mask: characters; hash: cut to this length (0: whole digest)
    algorithm: str = ""  # hash: PostgreSQL's function (md5, sha256, ...)
    salt: str = ""


def text_steps(
    rules: Sequence[Rule], column_id: str, t: ColumnType
) -> tuple[tuple[TextStep, ...], str | None]:
    """The transform that rewrote a column's values before staging, as steps PostgreSQL can
    repeat; or, when it cannot be repeated in SQL, why the column is not compared. Of several
    rules that match a column, the reader applies one (`Rule.rank`, then the order written)."""
    if t.name not in CHARACTER_TYPES or t.array:
        return (), None
    steps = []
    for rule in sorted((r for r in rules if r.matches(column_id)), key=Rule.rank)[:1]:
        if rule.truncate is not None:
            steps.append(TextStep("truncate", rule.truncate))
        elif rule.mask is not None:
            steps.append(TextStep("mask", rule.mask))
        elif not rule.v2 or rule.algorithm not in _PG_HASHES:
            assert rule.algorithm in ALGORITHMS
            return (), f"{rule.key} (PostgreSQL cannot repeat this hash)"
        else:
            length = t.modifier - 4 if t.name in ("varchar", "bpchar") and t.modifier > 4 else 0
            steps.append(TextStep("hash", length, _PG_HASHES[rule.algorithm], rule.salt))
    return tuple(steps), None


def apply_steps(steps: Sequence[TextStep], text: str) -> str:
    """The reference for `text_steps` (what the reader did to the value)."""
    for step in steps:
        if step.kind == "truncate":
            text = text[: step.length]
        elif step.kind == "mask":
            text = "*" * step.length
        else:
            digest = hashlib.new(step.algorithm, (step.salt + text).encode("utf-8")).hexdigest()
            text = digest[: step.length] if step.length else digest
    return text


def value_token(payload: str) -> str:
    return f"V{len(payload)}:{payload}"


def raw_token(text: str) -> str:
    return f"R{len(text)}:{text}"


def java_hex(x: float) -> str:
    """Java's `String.format("%a", x)`: what Spark's format_string('%a') prints."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    (bits,) = struct.unpack(">q", struct.pack(">d", x))
    sign = "-" if bits < 0 else ""
    exponent, mantissa = (bits >> 52) & 0x7FF, bits & _MANTISSA
    digits = f"{mantissa:013x}".rstrip("0") or "0"
    if exponent == 0:
        return f"{sign}0x0.{digits}p{'0' if mantissa == 0 else '-1022'}"
    return f"{sign}0x1.{digits}p{exponent - 1023}"


def token(value: object, t: SilverType) -> str:
    """The token of a silver value, as the converters of `cdc_core.pgtypes` produce it (days
    for dates, µs for timestamps, lists, dicts)."""
    if value is None:
        return NULL
    if t.name == "array":
        assert t.element is not None
        assert isinstance(value, list)
        return f"A{len(value)}:" + "".join(token(v, t.element) for v in value)
    if t.name == "map":
        assert t.element is not None
        assert isinstance(value, Mapping)
        entries = sorted(value.items(), key=lambda kv: str(kv[0]).encode("utf-8"))
        body = "".join(value_token(str(k)) + token(v, t.element) for k, v in entries)
        return f"M{len(entries)}:{body}"
    if t.name == "struct":
        assert isinstance(value, Mapping)
        return f"S{len(t.fields)}:" + "".join(token(value[n], f) for n, f in t.fields)
    return value_token(payload(value, t))


def payload(value: object, t: SilverType) -> str:
    """The payload of a scalar silver value."""
    if t.name == "boolean":
        return "t" if value else "f"
    if t.name in ("float", "double"):
        return java_hex(float(value))  # type: ignore[arg-type]
    if t.name == "decimal":
        assert isinstance(value, Decimal)
        return format(value, "f")
    if t.name == "binary":
        assert isinstance(value, bytes | bytearray)
        return bytes(value).hex()
    return str(value)  # ints (also days and µs), strings


def row_text(tokens: Sequence[str]) -> str:
    return "".join(tokens)


def hash60(text: str) -> int:
    """First 60 bits of MD5(UTF-8 of text), as PostgreSQL's and Spark's expressions compute."""
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:15], 16)
