"""Silver column types: PostgreSQL type -> Spark type, and exact converters from PostgreSQL text.

Captured values are PostgreSQL's text output (what `SELECT col::text` prints) under
DateStyle=ISO, MDY; IntervalStyle=iso_8601; TimeZone=UTC; extra_float_digits=1;
bytea_output=hex; lc_monetary=C. Bronze keeps that text; silver holds typed values:

| PostgreSQL type                                        | silver type (default modes)        |
|--------------------------------------------------------|------------------------------------|
| bool                                                   | boolean                            |
| bit(1)                                                 | boolean                            |
| int2 (smallint, smallserial)                           | short                              |
| int4 (integer, serial)                                 | int                                |
| int8 (bigint, bigserial), oid, xid, cid                | long                               |
| xid8                                                   | decimal(20,0)                      |
| numeric(p,s), p <= 38                                  | decimal(p,s)                       |
| numeric(p,s), p > 38; numeric                          | string (exact text)                |
| float4 (real)                                          | float                              |
| float8 (double precision)                              | double                             |
| money                                                  | decimal(17+n,n), n = money digits  |
| char(n), varchar(n), text, name, citext, "char"        | string (char(n) keeps its padding) |
| bytea                                                  | binary                             |
| date                                                   | date                               |
| timestamp                                              | timestamp_ntz                      |
| timestamptz                                            | timestamp (UTC instant)            |
| time(0..3)                                             | int (milliseconds past midnight)   |
| time(4..6), time                                       | long (microseconds past midnight)  |
| timetz                                                 | string (exact text)                |
| interval                                               | string (ISO 8601, exact text)      |
| point                                                  | struct<x: double, y: double>       |
| hstore                                                 | string (JSON object)               |
| uuid, json, jsonb, xml, inet, cidr, macaddr, macaddr8, | string (exact text)                |
| tsvector, tsquery, pg_lsn, bit(n > 1), varbit, line,   |                                    |
| lseg, box, path, polygon, circle, ltree, enums,        |                                    |
| ranges, multiranges, composites, any other type (an    |                                    |
| extension's base type not named here: with a warning)  |                                    |
| T[] (an array of any type above)                       | array<silver type of T>            |

Domains count as their base type (the catalog resolves them). The modes change:

- decimal (`decimal.handling.mode`): precise as above, money with `money.fraction.digits`
  (default 2: decimal(19,2); rounded half up, as Debezium's setScale(n, HALF_UP)); double:
  numeric and money -> double (NaN and infinities allowed); string: numeric -> its exact
  text, money -> '-1234.56'. The double and string modes ignore the money digits, as Debezium.
- time_precision (`time.precision.mode`): only `time` depends on it. adaptive as above;
  adaptive_time_microseconds and microseconds: long µs; nanoseconds: long ns (Debezium's
  NanoTime; µs * 1000, exact); isostring: the exact text '04:05:11.789' (no 'Z' is added: a
  time without time zone is not UTC); connect: int milliseconds, truncating beyond
  milliseconds (Debezium's documented loss). timetz stays its exact text, dates and
  timestamps are Spark dates and timestamps, in every mode.
- interval (`interval.handling.mode`): string as above; numeric: long microseconds with
  Debezium's approximation (a month is 30.4375 days, a year 12 months), computed exactly.
- binary (`binary.handling.mode`): bytes as above; base64, base64-url-safe (both padded)
  and hex (lower case) -> string.
- hstore (`hstore.handling.mode`): json as above, compact ('{"a":"1","b":null}', keys in
  the hstore's order, non-ASCII kept); map -> map<string, string> (values may be null).

A value the silver type cannot hold exactly raises Unrepresentable (the caller stores NULL
and keeps the text in bronze): numeric NaN/Infinity in a decimal; dates and timestamps
that are infinite, BC or past year 9999 (a timestamptz is checked in UTC); an interval
'infinity' or beyond a long of µs in numeric mode; an array with a lower bound other than 1
or with more than one dimension; an array with any Unrepresentable element.

Python values per silver type: boolean -> bool; short/int/long -> int; float/double -> float;
decimal -> Decimal with the column's scale; string -> str; binary -> bytes; date -> int days
since 1970-01-01; timestamp -> int µs since the epoch; timestamp_ntz -> int wall-clock µs
since 1970-01-01T00:00; array -> list (None for NULL elements); map -> dict; struct -> dict.
"""

from cdc_core.pgtypes.mapping import Converter, converter, is_unknown, silver_type
from cdc_core.pgtypes.schema import (
    DEFAULT_MODES,
    ColumnType,
    SilverType,
    TypeModes,
    Unrepresentable,
)

__all__ = [
    "DEFAULT_MODES",
    "ColumnType",
    "Converter",
    "SilverType",
    "TypeModes",
    "Unrepresentable",
    "converter",
    "is_unknown",
    "silver_type",
]
