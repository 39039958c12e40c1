"""Debezium's source-type parameters for silver field metadata, from the catalog's type."""

from __future__ import annotations

import pytest

from cdc_core.pgtypes import DEFAULT_MODES, ColumnType, silver_type
from cdc_core.silver import SilverSettings
from cdc_core.silver_shape import SilverColumn, source_type

T, L, S = (f"__debezium.source.column.{k}" for k in ("type", "length", "scale"))


@pytest.mark.parametrize(
    ("pg", "expected"),
    [  # Debezium's own vectors: varchar(2) -> VARCHAR 2 0, numeric(3,2) -> NUMERIC 3 2
        (ColumnType("varchar", "b", 2 + 4, False), {T: "VARCHAR", L: "2", S: "0"}),
        (ColumnType("numeric", "b", ((3 << 16) | 2) + 4, False), {T: "NUMERIC", L: "3", S: "2"}),
        (ColumnType("numeric", "b", ((4 << 16) | 0) + 4, False), {T: "NUMERIC", L: "4", S: "0"}),
        (ColumnType("numeric", "b", ((5 << 16) | (-2 & 0x7FF)) + 4, False),
         {T: "NUMERIC", L: "5", S: "-2"}),
        (ColumnType("numeric", "b", -1, False), {T: "NUMERIC"}),
        (ColumnType("bpchar", "b", 8 + 4, False), {T: "BPCHAR", L: "8", S: "0"}),
        (ColumnType("varbit", "b", 24, False), {T: "VARBIT", L: "24", S: "0"}),
        (ColumnType("timestamptz", "b", 3, False), {T: "TIMESTAMPTZ", S: "3"}),
        (ColumnType("interval", "b", (0x7FFF << 16) | 0xFFFF, False), {T: "INTERVAL"}),
        (ColumnType("int4", "b", -1, True), {T: "_INT4"}),
        (ColumnType("text", "b", -1, False), {T: "TEXT"}),
    ],
)  # fmt: skip
def test_source_type_parameters(pg: ColumnType, expected: dict[str, str]) -> None:
    assert source_type(pg) == expected


def test_columns_are_chosen_by_name_or_by_type() -> None:
    def col(name: str, pg: ColumnType) -> SilverColumn:
        return SilverColumn(name, pg, silver_type(pg, DEFAULT_MODES), pg.name)

    settings = SilverSettings(
        propagate_columns=(r"public\.t\.a",), propagate_types=(r".*\.numeric",)
    )
    text, num = ColumnType("text", "b", -1, False), ColumnType("numeric", "b", -1, False)
    assert settings.propagates("public.t", col("a", text))
    assert not settings.propagates("public.t", col("ab", text))  # anchored
    assert not settings.propagates("public.u", col("a", text))
    assert settings.propagates("public.u", col("n", num))
    assert not settings.propagates("public.u", col("n", ColumnType("numeric", "b", -1, True)))
    assert not SilverSettings().propagates("public.t", col("a", text))
    assert settings.propagates("public.t", col("A", text))  # any case, as in Debezium
    assert settings.propagates("public.u", col("n", ColumnType("NUMERIC", "b", -1, False)))
