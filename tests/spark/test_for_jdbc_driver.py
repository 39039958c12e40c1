"""`for_jdbc` against the PostgreSQL JDBC driver's own parser (the jar snapshot reads load):
the SQL the server gets is the query as written, with no parameter marks, whatever the driver
takes for a literal, a quoted name or a comment."""

from __future__ import annotations

import random

import pytest
from py4j.java_gateway import get_field
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from cdc_core.pg.sql_text import for_jdbc

CONDITIONS = [
    "doc ? 'k'",
    "doc ?| array['a', 'b'] AND doc ?& array['c'] AND note = 'what?'",
    "note = 'it''s ?' AND d ? 'x'",
    "n = E'a\\'?' AND d ? 'k'",
    "n = E'a''b\\'c ? d'",  # the driver ends E'a' at the first quote of ''
    "n = E'a''\\'' AND doc ? 'k'",
    "n = '\\' AND d ? 'x'",
    '"odd?name" ? \'k\' AND "a""?b" = 1',
    "d ? 'k' -- why?\nAND e ? 'j'",
    "n = 1 -- why\rAND doc ? 'k'\n",
    "d /* a /* nested? */ still? */ ? 'k'",
    "n = 1 /*/ ? */",  # /*/ opens and closes a comment, to the driver
    "x = $$a?b$$ AND d ? 'k'",
    "x = $t$ $$ ? $t$ AND d ? 'k'",
    "n = $\u00e9t\u00e9$ ? $\u00e9t\u00e9$",
    "n = $\U0001f600$ ? $\U0001f600$",  # not a tag to the driver: surrogates are no letters
    "n = $\U0001d400$ ? $\U0001d400$",  # nor of a letter outside the Basic Multilingual Plane
    "n = $1$ ? $1$",  # a tag starts as a name does
    "n = $\u20ac$ ? $\u20ac$ AND x\u0301$a$ ? $a$",  # a currency sign is, a combining mark too
    "n = \u20ac$a$ ? $a$",
    "price$ ? 'k' AND $1x ? 'k'",
    "d ?? 'k'",
    "'unterminated ?",
    "n = '{fn now()}' AND d ? '{d ''2020-01-01''}'",  # JDBC escapes, inside literals
    "x = $${ts '2020-01-01'}$$ /* {oj x} */ AND \"{escape '?'}\" = 1 -- {t '10:00'}\n",
]


def sent(spark: SparkSession, query: str) -> tuple[str, int]:
    """What the driver sends for `query`, a prepared statement: (the SQL, parameter marks).

    As the driver does for a prepared statement's text: JDBC escapes (`{fn ...}`, `{d '...'}`)
    replaced first, then the text split into statements and parameter marks.
    """
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    assert jvm is not None
    assert gateway is not None
    parser = jvm.org.postgresql.core.Parser
    try:
        escaped = parser.replaceProcessing(query, True, True)
    except Py4JJavaError:  # an unterminated literal, name or comment: refused, as by the server
        escaped = query
    parsed = parser.parseJdbcSql(
        escaped, True, True, False, False, False, gateway.new_array(jvm.java.lang.String, 0)
    )
    assert parsed.size() == 1
    native = parsed.get(0)
    return get_field(native, "nativeSql"), len(get_field(native, "bindPositions"))


@pytest.mark.parametrize("condition", CONDITIONS)
def test_the_driver_sends_the_condition_as_written(spark: SparkSession, condition: str) -> None:
    query = f'SELECT "v" FROM (SELECT * FROM t WHERE ("id" >= 1) AND ({condition})) AS c'
    assert sent(spark, for_jdbc(query)) == (query, 0)


def test_the_driver_sends_any_text_as_written(spark: SparkSession) -> None:
    """Random text of the pieces the driver's lexer turns on (seeded: the same each run)."""
    rng = random.Random(20261126)
    pieces = [*"'\"?$-/*\\eE \n\rt_1", "--", "/*", "*/", "E'", "''", "$$", "$t$", "\\'", "??",
              "\u00e9", "\u20ac", "\U0001f600", "\u0301"]  # fmt: skip
    for _ in range(1500):  # 4,000 until 2026-11-28: 110 s of the CI's 90 minutes on a slow day
        text = "SELECT " + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert sent(spark, for_jdbc(text)) == (text, 0), repr(text)
