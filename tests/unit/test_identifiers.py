"""Table names parse the way PostgreSQL parses them and print back to the same name."""

from __future__ import annotations

import pytest

from cdc_core.identifiers import TableName, quote_if_needed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", TableName("public", "orders")),
        ("public.orders", TableName("public", "orders")),
        ("Public.Orders", TableName("public", "orders")),
        ('"Sales"."Order Items"', TableName("Sales", "Order Items")),
        ('sales."a.b"', TableName("sales", "a.b")),
        ('"x""; DROP TABLE y; --"', TableName("public", 'x"; DROP TABLE y; --')),
        ('"東京".データ', TableName("東京", "データ")),
        ("_t$1", TableName("public", "_t$1")),
    ],
)
def test_names_parse_like_postgresql(text: str, expected: TableName) -> None:
    assert TableName.parse(text) == expected


@pytest.mark.parametrize(
    "name",
    [
        TableName("public", "orders"),
        TableName("Sales", "Order Items"),
        TableName("public", "a.b"),
        TableName("s", 'x"; DROP TABLE y; --'),
        TableName("select", "from"),
    ],
)
def test_str_parses_back_to_the_same_name(name: TableName) -> None:
    assert TableName.parse(str(name)) == name


@pytest.mark.parametrize(
    "text", ["", "a.b.c", '"unterminated', '""', "order items", "1abc", "a..b", "a."]
)
def test_invalid_names_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"valid name|parts|quoted identifier"):
        TableName.parse(text)


def test_names_longer_than_63_bytes_are_rejected() -> None:
    with pytest.raises(ValueError, match="63 bytes"):
        TableName.parse("t" * 64)


def test_quote_if_needed_quotes_only_what_needs_it() -> None:
    assert quote_if_needed("orders") == "orders"
    assert quote_if_needed("Orders") == '"Orders"'
    assert quote_if_needed('a"b') == '"a""b"'


def test_qualified_is_the_debezium_form() -> None:
    assert TableName("Sales", "Order Items").qualified == "Sales.Order Items"
