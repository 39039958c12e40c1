"""A snapshot's query as the JDBC driver must get it: a `?` it would take for a parameter mark
(jsonb's `?`, `?|`, `?&`) is doubled; one inside a literal, a quoted name or a comment is not."""

from __future__ import annotations

import pytest

from cdc_core.pg.sql_text import for_jdbc, leaves_parentheses


@pytest.mark.parametrize(
    ("query", "sent"),
    [
        ("doc ? 'k'", "doc ?? 'k'"),
        (
            "doc ?| array['a', 'b'] AND doc ?& array['c']",
            "doc ??| array['a', 'b'] AND doc ??& array['c']",
        ),
        ("note = 'what?'", "note = 'what?'"),
        ("note = 'it''s ?' AND d ? 'x'", "note = 'it''s ?' AND d ?? 'x'"),
        ("note = E'\\' ?' AND d ? 'x'", "note = E'\\' ?' AND d ?? 'x'"),
        ("note = '\\' AND d ? 'x'", "note = '\\' AND d ?? 'x'"),  # no escapes in a plain literal
        ("\"odd?name\" ? 'k'", "\"odd?name\" ?? 'k'"),
        ('"a""?b" = 1 AND d ? \'k\'', '"a""?b" = 1 AND d ?? \'k\''),
        ("d ? 'k' -- why?\nAND e ? 'j'", "d ?? 'k' -- why?\nAND e ?? 'j'"),
        ("d /* a /* nested? */ still? */ ? 'k'", "d /* a /* nested? */ still? */ ?? 'k'"),
        ("x = $$a?b$$ AND d ? 'k'", "x = $$a?b$$ AND d ?? 'k'"),
        ("x = $t$ $$ ? $t$ AND d ? 'k'", "x = $t$ $$ ? $t$ AND d ?? 'k'"),
        ("price$ ? 'k'", "price$ ?? 'k'"),  # a $ inside a name opens no quote
        ("'unterminated ?", "'unterminated ?"),
        ("format('%s', v)", "format('%s', v)"),
    ],
)
def test_question_marks_outside_quotes_are_doubled(query: str, sent: str) -> None:
    assert for_jdbc(query) == sent


@pytest.mark.parametrize(
    ("condition", "reaches"),
    [
        ("v < 10", None),
        ("note = 'a;b)' AND (v > 1 OR v < -1)", None),  # inside a literal: part of the value
        ('"odd;)" = 1', None),
        ("x = $$;)$$", None),
        ("v < 3 -- why; not)\n", None),
        ("v < 3 /* ; ) */", None),
        ("true); COMMIT; DROP TABLE victim; --", "a ')' at character 5"),
        ("v < 3; DROP TABLE victim", "a ';' at character 6: one condition, not several"),
        ("true) OR (true", "a ')' at character 5 that closes more than the condition opened"),
        ("(v < 3))", "a ')' at character 8"),
    ],
)
def test_a_condition_that_reaches_past_its_parentheses_is_named(
    condition: str, reaches: str | None
) -> None:
    """A snapshot's condition goes inside parentheses in the read's query: a `;` would start
    another statement (the driver runs each), a `)` too many would end the condition early."""
    found = leaves_parentheses(condition)
    if reaches is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(reaches), found
