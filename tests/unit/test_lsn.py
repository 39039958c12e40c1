"""Lsn parses and prints PostgreSQL's form, orders by value, and sorts as fixed-width hex."""

from __future__ import annotations

import pytest

from cdc_core.lsn import Lsn


@pytest.mark.parametrize(
    ("text", "value"),
    [("0/0", 0), ("16/B374D848", 0x16_B374D848), ("0/AB", 0xAB), ("FFFFFFFF/FFFFFFFF", 2**64 - 1)],
)
def test_parse_and_print_round_trip(text: str, value: int) -> None:
    lsn = Lsn.parse(text)
    assert lsn.value == value
    assert str(lsn) == text
    assert Lsn.parse(lsn.hex16) == lsn


def test_order_is_numeric_and_hex16_sorts_the_same_way() -> None:
    lsns = [Lsn.parse(t) for t in ("1/0", "0/FFFFFFFF", "A/1", "0/10")]
    assert sorted(lsns) == sorted(lsns, key=lambda x: x.hex16)
    assert sorted(lsns)[0] == Lsn.parse("0/10")


def test_difference_is_bytes_of_wal() -> None:
    assert Lsn.parse("1/0") - Lsn.parse("0/FFFFFFFF") == 1
    assert Lsn.parse("0/10") + 16 == Lsn.parse("0/20")


@pytest.mark.parametrize("text", ["", "16B374D848", "0/", "/1", "G/0", "1/2/3", "123456789/0"])
def test_malformed_text_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="is not an LSN"):
        Lsn.parse(text)


def test_values_outside_64_bits_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside"):
        Lsn(-1)
    with pytest.raises(ValueError, match="outside"):
        Lsn(2**64)
