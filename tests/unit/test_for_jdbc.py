"""A snapshot's query as the JDBC driver must get it: a `?` it would take for a parameter mark
(jsonb's `?`, `?|`, `?&`) is doubled; one inside a literal, a quoted name or a comment is not."""

from __future__ import annotations

import pytest

from cdc_core.snapshot_read import for_jdbc


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
