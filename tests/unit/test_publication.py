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


def test_a_table_is_a_member_by_its_own_row_and_its_schema_s() -> None:
    pub = PublicationInfo(
        "p", "owner", True, False, frozenset(), frozenset([A, B]), True,
        table_rows=frozenset([(A, 16400), (B, 16401)]), schema_rows=frozenset([("public", 16500)]),
    )  # fmt: skip
    assert pub.membership(A) == {"table 16400", "schema 16500"}
    assert pub.membership(B) == {"table 16401"}


def test_a_publication_for_all_tables_has_no_membership_rows() -> None:
    assert _publication(all_tables=True).membership(A) == frozenset()
