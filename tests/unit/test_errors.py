"""Error texts the product quotes: the first line of a server's message, never an IndexError."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg

from cdc_core.errors import first_line
from cdc_core.validate_quality import _detail


def test_first_line_keeps_a_server_message_s_first_line_and_names_an_empty_error() -> None:
    said = psycopg.errors.UndefinedColumn('column "id" does not exist\nLINE 1: SELECT id\nHINT: x')
    assert first_line(said) == 'column "id" does not exist'
    assert first_line(RuntimeError("  \n ")) == "RuntimeError"
    assert first_line(ValueError()) == "ValueError"
    assert first_line("\n  ") == "no message"
    assert first_line("  the text\nmore") == "the text"


def test_an_expectation_that_raised_without_a_message_says_it_could_not_run() -> None:
    # a failed expectation's text was split with [0]: an empty message raised IndexError
    for message, said in (("", "no message"), ("boom\nTraceback ...", "boom")):
        outcome = SimpleNamespace(
            exception_info={"raised_exception": True, "exception_message": message}, result={}
        )
        assert _detail(outcome) == f"could not run: {said}"
