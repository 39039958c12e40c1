"""The signal table on a real server: unprocessed rows come back in order, a missing table is named.

Signals are inserted with the reference's own INSERT statements. Two adaptations: each row gets
its own id (the reference reuses 'ad-hoc-1', a primary key), and the statement with `\\'` is an
E'' string, since PostgreSQL's standard strings do not treat a backslash as an escape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.signals import (
    SnapshotRequest,
    StopRequest,
    parse_signal,
    read_signals,
    signal_table_ddl,
)
from tests.integration.conftest import PgServer
from tests.integration.privileges import product_conninfo

SIGNALS = TableName("myschema", "debezium_signal")
CAPTURED = [
    TableName("schema1", "table1"),
    TableName("schema1", "table2"),
    TableName("schema1", "products"),
]
REFERENCE_INSERTS = [
    """INSERT INTO myschema.debezium_signal (id, type, data) values ('ad-hoc-1', 'execute-snapshot', E'{"data-collections": ["schema1.table1", "schema1.table2"], "type":"incremental", "additional-conditions":[{"data-collection": "schema1.table1" ,"filter":"color=\\'blue\\'"}]}');""",
    """INSERT INTO myschema.debezium_signal (id, type, data) VALUES('ad-hoc-2', 'execute-snapshot', '{"data-collections": ["schema1.products"],"type":"incremental", "additional-conditions":[{"data-collection": "schema1.products", "filter": "color=blue"}]}');""",
    """INSERT INTO myschema.debezium_signal (id, type, data) VALUES('ad-hoc-3', 'execute-snapshot', '{"data-collections": ["schema1.products"],"type":"incremental", "additional-conditions":[{"data-collection": "schema1.products", "filter": "color=blue AND quantity>10"}]}');""",
    """INSERT INTO myschema.debezium_signal (id, type, data) values ('ad-hoc-4', 'stop-snapshot', '{"data-collections": ["schema1.table1", "schema1.table2"], "type":"incremental"}');""",
]


@pytest.fixture
def conn(pg: PgServer, database: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg.dsn(database), autocommit=True) as connection:
        yield connection


@pytest.fixture
def reader(pg: PgServer, database: str) -> Iterator[psycopg.Connection[Any]]:
    """The product's connection: signals are read as the least-privilege role."""
    with psycopg.connect(product_conninfo(pg.dsn(database)), autocommit=True) as connection:
        yield connection


@pytest.fixture
def signal_table(conn: psycopg.Connection[Any]) -> TableName:
    conn.execute("CREATE SCHEMA myschema")
    conn.execute(signal_table_ddl(SIGNALS))
    for insert in REFERENCE_INSERTS:
        conn.execute(insert)
    return SIGNALS


def test_reference_signals_are_read_in_id_order(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    rows = read_signals(reader, signal_table, processed=())
    assert [(i, t) for i, t, _ in rows] == [
        ("ad-hoc-1", "execute-snapshot"),
        ("ad-hoc-2", "execute-snapshot"),
        ("ad-hoc-3", "execute-snapshot"),
        ("ad-hoc-4", "stop-snapshot"),
    ]
    assert rows[0][2] is not None
    assert "color='blue'" in rows[0][2]


def test_processed_signals_are_skipped(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    rows = read_signals(reader, signal_table, processed={"ad-hoc-1", "ad-hoc-3", "never-sent"})
    assert [i for i, _, _ in rows] == ["ad-hoc-2", "ad-hoc-4"]
    assert read_signals(reader, signal_table, processed=[f"ad-hoc-{n}" for n in range(1, 5)]) == []


def test_signals_read_back_parse_into_requests(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    signals = [parse_signal(*row, CAPTURED) for row in read_signals(reader, signal_table, ())]
    table1, table2, products = CAPTURED
    assert signals == [
        SnapshotRequest(
            "ad-hoc-1", "incremental", (table1, table2), {table1: "color='blue'"}, None
        ),
        SnapshotRequest("ad-hoc-2", "incremental", (products,), {products: "color=blue"}, None),
        SnapshotRequest(
            "ad-hoc-3", "incremental", (products,), {products: "color=blue AND quantity>10"}, None
        ),
        StopRequest("ad-hoc-4", (table1, table2)),
    ]


@pytest.mark.parametrize(
    "ordering_column",
    [
        "created_at timestamptz NOT NULL DEFAULT clock_timestamp()",
        "seq bigint GENERATED ALWAYS AS IDENTITY",
        "seq bigserial",
    ],
)
def test_an_ordering_column_orders_signals_oldest_first(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], ordering_column: str
) -> None:
    conn.execute(
        "CREATE TABLE public.debezium_signal (id varchar(42) PRIMARY KEY, "
        f"type varchar(32) NOT NULL, data varchar(2048) NULL, {ordering_column})"
    )
    for signal_id in ("z-first", "m-second", "a-third"):
        conn.execute(
            "INSERT INTO public.debezium_signal (id, type, data) VALUES (%s, 'log', NULL)",
            (signal_id,),
        )
    rows = read_signals(reader, TableName("public", "debezium_signal"), ())
    assert [i for i, _, _ in rows] == ["z-first", "m-second", "a-third"]


def test_quoted_signal_table_name_with_jsonb_data_is_read(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any]
) -> None:
    conn.execute('CREATE SCHEMA "Ops"')
    conn.execute(
        'CREATE TABLE "Ops"."Debezium Signal.v2" (id text PRIMARY KEY, type text, data jsonb)'
    )
    conn.execute(
        'INSERT INTO "Ops"."Debezium Signal.v2" VALUES '
        """('s1', 'execute-snapshot', '{"data-collections": ["public.\\"My.Table\\""]}')"""
    )
    rows = read_signals(reader, TableName("Ops", "Debezium Signal.v2"), ())
    my_table = TableName("public", "My.Table")
    assert [parse_signal(*row, [my_table]) for row in rows] == [
        SnapshotRequest("s1", "incremental", (my_table,), {}, None)
    ]


def test_missing_signal_table_names_it_and_how_to_create_it(
    conn: psycopg.Connection[Any],
    reader: psycopg.Connection[Any],
) -> None:
    with pytest.raises(TerminalError) as caught:
        read_signals(reader, SIGNALS, ())
    message = str(caught.value)
    assert (
        "signal table myschema.debezium_signal (signal.data.collection) does not exist" in message
    )
    assert (
        "CREATE TABLE myschema.debezium_signal (id varchar(42) PRIMARY KEY, "
        "type varchar(32) NOT NULL, data varchar(2048) NULL);"
    ) in message


def test_signal_table_without_a_data_column_is_a_terminal_error(
    conn: psycopg.Connection[Any],
    reader: psycopg.Connection[Any],
) -> None:
    conn.execute("CREATE TABLE public.debezium_signal (id varchar(42) PRIMARY KEY, type text)")
    with pytest.raises(TerminalError, match="has no column data"):
        read_signals(reader, TableName("public", "debezium_signal"), ())
