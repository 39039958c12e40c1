"""Which configured tables a publication lacks: the ones whose changes are not sent."""

from __future__ import annotations

from cdc_core.identifiers import TableName
from cdc_core.pg.catalog import PublicationInfo

A, B = TableName("public", "a"), TableName("Sales", "Order Items")


def _publication(*tables: TableName, all_tables: bool = False) -> PublicationInfo:
    return PublicationInfo("p", "owner", True, all_tables, frozenset(), frozenset(tables), True)


def test_a_publication_lacks_the_tables_it_does_not_list() -> None:
    assert _publication(A).lacks([A, B]) == [B]


def test_a_publication_for_all_tables_lacks_none() -> None:
    assert _publication(all_tables=True).lacks([A, B]) == []
