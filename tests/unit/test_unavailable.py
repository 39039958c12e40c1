"""unavailable.value.placeholder: the setting -> the text bronze holds for each column type."""

from __future__ import annotations

import pytest

from cdc_core.events import ColumnDescriptor
from cdc_core.pgtypes.containers import parse_array, parse_hstore
from cdc_core.unavailable import DEFAULT, Placeholder, placeholder_octets


def column(base: str, *, array: bool = False, kind: str = "b") -> ColumnDescriptor:
    return ColumnDescriptor("c", 0, -1, base, False, base, kind, -1, array)


def test_the_setting_is_utf8_text_unless_it_starts_with_hex() -> None:
    assert placeholder_octets(DEFAULT) == b"__debezium_unavailable_value"
    assert placeholder_octets("hex:DEADbeef") == b"\xde\xad\xbe\xef"
    assert placeholder_octets("hex:") == b""
    assert placeholder_octets("Zoë") == "Zoë".encode()
    assert placeholder_octets("HEX:ab") == b"HEX:ab"  # the prefix is lower case, as Debezium's


@pytest.mark.parametrize("setting", ["hex:abc", "hex:zz", "hex:0x12", "hex: 12"])
def test_a_hex_setting_must_be_pairs_of_hex_digits(setting: str) -> None:
    with pytest.raises(ValueError, match="hexadecimally encoded octets"):
        placeholder_octets(setting)


def test_bytea_gets_the_octets_and_text_columns_their_text() -> None:
    hexed = Placeholder.of("hex:5f5f756e6176")  # "__unav"
    assert hexed.for_column(column("bytea")) == "\\x5f5f756e6176"
    assert hexed.for_column(column("text")) == "__unav"
    assert hexed.for_column(column("jsonb")) == "__unav"
    plain = Placeholder.of("__unav")
    assert plain.for_column(column("bytea")) == "\\x5f5f756e6176"  # the setting's UTF-8
    assert plain.for_column(column("varchar")) == "__unav"
    assert plain.for_column(column("mood", kind="e")) == "__unav"  # an enum: its text


def test_octets_that_are_not_utf8_read_as_replacement_characters_in_text() -> None:
    placeholder = Placeholder.of("hex:ff41")
    assert placeholder.for_column(column("text")) == "\ufffdA"
    assert placeholder.for_column(column("bytea")) == "\\xff41"


def test_arrays_and_hstore_get_a_value_of_their_type_as_debezium() -> None:
    placeholder = Placeholder.of("hex:7b2c22205c7f81")  # {," \\ DEL, 0x81
    text = placeholder.text
    for element in ("text", "varchar", "bpchar", "json", "jsonb"):
        written = placeholder.for_column(column(element, array=True))
        assert parse_array(written, str) == [text]
    assert placeholder.for_column(column("int4", array=True)) == "{123,44,34,32,92,127,-127}"
    assert placeholder.for_column(column("int8", array=True)) == "{123,44,34,32,92,127,-127}"
    dates = parse_array(placeholder.for_column(column("date", array=True)), str)
    assert dates[0] == "1970-05-04"  # 123 days after 1970-01-01
    assert dates[-1] == "1969-08-27"  # 127 days before
    bytea = parse_array(placeholder.for_column(column("bytea", array=True)), str)
    assert bytea == ["\\x7b2c22205c7f81"]
    assert parse_hstore(placeholder.for_column(column("hstore"))) == {text: text}
    assert Placeholder.of("x").for_column(column("text", array=True)) == "{x}"
    assert Placeholder.of("null").for_column(column("text", array=True)) == '{"null"}'


def test_a_uuid_array_gets_javas_name_based_uuid_of_the_octets() -> None:
    # java.util.UUID.nameUUIDFromBytes("__debezium_unavailable_value".getBytes()), in jshell
    written = Placeholder().for_column(column("uuid", array=True))
    assert written == "{b68a35a7-17ad-35b3-af2a-ae46edb4545a}"
