"""The signal table on a real server: rows come back in the order they were sent, known by the
transaction that inserted them (not by id), processed ones marked; a missing table is named.
And at a run's start: a stop sent after an execute stops it, a re-sent id runs again.

Signals are inserted with the reference's own INSERT statements. Two adaptations: each row gets
its own id (the reference reuses 'ad-hoc-1', a primary key), and the statement with `\\'` is an
E'' string, since PostgreSQL's standard strings do not treat a backslash as an escape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_core.config import Config, load_pipeline
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.signals import (
    SnapshotRequest,
    StopRequest,
    parse_signal,
    read_signals,
    signal_table_ddl,
)
from cdc_core.snapshot import load_jobs
from cdc_core.start import start
from cdc_core.state import read_json, signals_file, write_json
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline, sql
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


def test_reference_signals_are_read_in_the_order_they_were_sent(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    rows = read_signals(reader, signal_table, processed=())
    assert [(r.id, r.type, r.processed) for r in rows] == [
        ("ad-hoc-1", "execute-snapshot", False),
        ("ad-hoc-2", "execute-snapshot", False),
        ("ad-hoc-3", "execute-snapshot", False),
        ("ad-hoc-4", "stop-snapshot", False),
    ]
    assert rows[0].data is not None
    assert "color='blue'" in rows[0].data


def test_signals_are_read_in_the_order_they_were_sent_not_by_id(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any]
) -> None:
    """'sig-10' < 'sig-9' as text: read by id, the stop came before the snapshot it stops."""
    conn.execute(signal_table_ddl(TableName("public", "debezium_signal")))
    for signal_id in ("sig-9", "sig-10", "a-11"):
        conn.execute("INSERT INTO debezium_signal VALUES (%s, 'log', NULL)", (signal_id,))
    rows = read_signals(reader, TableName("public", "debezium_signal"), ())
    assert [r.id for r in rows] == ["sig-9", "sig-10", "a-11"]


def test_processed_signals_are_marked_and_their_data_not_read(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    first = read_signals(reader, signal_table, processed=())
    done = [first[0].key, first[2].key, "123:never-sent"]
    rows = read_signals(reader, signal_table, processed=done)
    assert [(r.id, r.processed, r.data is None) for r in rows] == [
        ("ad-hoc-1", True, True),
        ("ad-hoc-2", False, False),
        ("ad-hoc-3", True, True),
        ("ad-hoc-4", False, False),
    ]


def test_a_row_inserted_again_with_a_used_id_has_a_new_key(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    before = read_signals(reader, signal_table, processed=())
    conn.execute("DELETE FROM myschema.debezium_signal WHERE id = 'ad-hoc-1'")
    conn.execute(REFERENCE_INSERTS[0])
    rows = read_signals(reader, signal_table, processed=[r.key for r in before])
    assert [(r.id, r.processed) for r in rows] == [
        ("ad-hoc-2", True),
        ("ad-hoc-3", True),
        ("ad-hoc-4", True),
        ("ad-hoc-1", False),
    ]


def test_signals_read_back_parse_into_requests(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    signals = [
        parse_signal(r.id, r.type, r.data, CAPTURED) for r in read_signals(reader, signal_table, ())
    ]
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
    assert [r.id for r in rows] == ["z-first", "m-second", "a-third"]


def test_signals_sent_in_one_transaction_come_in_ordering_column_order(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any]
) -> None:
    conn.execute(
        "CREATE TABLE public.debezium_signal (id varchar(42) PRIMARY KEY, "
        "type varchar(32) NOT NULL, data varchar(2048) NULL, created_at timestamptz NOT NULL)"
    )
    conn.execute(
        "INSERT INTO public.debezium_signal VALUES ('second', 'log', NULL, '2024-01-02'), "
        "('third', 'log', NULL, '2024-01-03'), ('first', 'log', NULL, '2024-01-01')"
    )
    rows = read_signals(reader, TableName("public", "debezium_signal"), ())
    assert [r.id for r in rows] == ["first", "second", "third"]


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
    assert [parse_signal(r.id, r.type, r.data, [my_table]) for r in rows] == [
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


def test_a_view_as_signal_table_is_a_terminal_error(
    conn: psycopg.Connection[Any], reader: psycopg.Connection[Any], signal_table: TableName
) -> None:
    conn.execute("CREATE VIEW public.signal_view AS SELECT * FROM myschema.debezium_signal")
    conn.execute("GRANT SELECT ON public.signal_view TO PUBLIC")
    with pytest.raises(TerminalError, match="is not a table"):
        read_signals(reader, TableName("public", "signal_view"), ())


EXECUTE = (
    "INSERT INTO debezium_signal VALUES "
    """(%s, 'execute-snapshot', '{"data-collections": ["public.items"]}')"""
)
STOP = """INSERT INTO debezium_signal VALUES (%s, 'stop-snapshot', '{"type": "incremental"}')"""


@pytest.fixture
def signalled(pg: PgServer, database: str, tmp_path: Path) -> tuple[Config, Lake]:
    """A pipeline of public.items with Debezium's signal table, started once (its slot made)."""
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 10) g",
        signal_table_ddl(TableName("public", "debezium_signal")),
    )
    p = make_pipeline(
        tmp_path, dsn, ["public.items"],
        snapshot_extra="signal.data.collection: public.debezium_signal\n",
    )  # fmt: skip
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    return config, p.lake


def test_a_stop_sent_after_an_execute_stops_it_whatever_their_ids(
    conn: psycopg.Connection[Any], signalled: tuple[Config, Lake]
) -> None:
    config, lake = signalled
    conn.execute(EXECUTE, ("sig-9",))
    conn.execute(STOP, ("sig-10",))  # 'sig-10' < 'sig-9': by id, the stop came first
    run = start(config, lake)
    [job] = load_jobs(lake)
    assert (job.origin, job.stopped) == ("signal sig-9", True)
    assert run.jobs == ()
    assert run.aborted == (job.id,)  # the batch line's SnapshotAborted
    assert start(config, lake).aborted == ()  # stopped before this start: not again


def test_a_signal_sent_again_with_a_used_id_runs_again_once(
    conn: psycopg.Connection[Any], signalled: tuple[Config, Lake]
) -> None:
    config, lake = signalled
    conn.execute(EXECUTE, ("ad-hoc-1",))
    start(config, lake)
    conn.execute("DELETE FROM debezium_signal")
    conn.execute(EXECUTE, ("ad-hoc-1",))
    start(config, lake)
    start(config, lake)
    jobs = load_jobs(lake)
    assert [j.origin for j in jobs] == ["signal ad-hoc-1", "signal ad-hoc-1"]
    # only the row still in the table is remembered: the record does not grow without end
    assert read_json(signals_file(lake)) == {"processed": [jobs[1].signal]}


def test_a_signal_whose_job_was_saved_is_not_run_again_after_a_crash(
    conn: psycopg.Connection[Any], signalled: tuple[Config, Lake]
) -> None:
    config, lake = signalled
    conn.execute(EXECUTE, ("ad-hoc-1",))
    start(config, lake)
    write_json(signals_file(lake), {"processed": []})  # died after saving the job, before marking
    start(config, lake)
    assert len(load_jobs(lake)) == 1
    assert read_json(signals_file(lake)) == {"processed": [load_jobs(lake)[0].signal]}


def test_signals_processed_by_id_before_an_upgrade_are_not_run_again(
    conn: psycopg.Connection[Any], signalled: tuple[Config, Lake]
) -> None:
    config, lake = signalled
    conn.execute(EXECUTE, ("ad-hoc-1",))
    write_json(signals_file(lake), ["ad-hoc-1"])  # the record of earlier versions: ids
    start(config, lake)
    assert load_jobs(lake) == []
    [key] = read_json(signals_file(lake))["processed"]
    assert key.endswith(":ad-hoc-1")


def test_a_pause_sent_after_an_execute_pauses_it_until_a_resume(
    conn: psycopg.Connection[Any], signalled: tuple[Config, Lake]
) -> None:
    config, lake = signalled
    conn.execute(EXECUTE, ("snap-1",))
    conn.execute("INSERT INTO debezium_signal VALUES ('pause-1', 'pause-snapshot', NULL)")
    run = start(config, lake)
    [job] = load_jobs(lake)
    assert job.paused
    assert [j.id for j in run.jobs] == [job.id]  # unfinished: its reads wait, silver goes on
    start(config, lake)
    assert load_jobs(lake)[0].paused  # across runs
    conn.execute("INSERT INTO debezium_signal VALUES ('resume-1', 'resume-snapshot', NULL)")
    start(config, lake)
    assert not load_jobs(lake)[0].paused


@pytest.mark.parametrize(
    ("order", "expected"),
    [("disabled", ["big", "small", "mid"]), ("ascending", ["small", "mid", "big"]),
     ("descending", ["big", "mid", "small"])],
)  # fmt: skip
def test_initial_and_blocking_snapshots_read_their_tables_in_the_row_count_order_asked(
    pg: PgServer, database: str, tmp_path: Path, order: str, expected: list[str]
) -> None:
    """snapshot.tables.order.by.row.count orders an initial snapshot's tables and a blocking
    one's; an incremental snapshot reads them as the signal lists them, as in Debezium."""
    dsn = pg.dsn(database)
    tables = {"big": 300, "small": 10, "mid": 100}  # listed neither ascending nor descending
    sql(dsn, signal_table_ddl(TableName("public", "debezium_signal")), *(
        s for name, rows in tables.items() for s in (
            f"CREATE TABLE {name} (id int PRIMARY KEY)",
            f"INSERT INTO {name} SELECT generate_series(1, {rows})",
        )
    ))  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, [f"public.{t}" for t in tables], snapshot="initial",
        snapshot_extra="signal.data.collection: public.debezium_signal\n"
                       f"tables.order.by.row.count: {order}\n",
    )  # fmt: skip
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    listed = '["public.big", "public.small", "public.mid"]'
    sql(dsn, "INSERT INTO debezium_signal VALUES ('b', 'execute-snapshot', "
             f"""'{{"data-collections": {listed}, "type": "blocking"}}')""",
        "INSERT INTO debezium_signal VALUES ('i', 'execute-snapshot', "
        f"""'{{"data-collections": {listed}, "type": "incremental"}}')""")  # fmt: skip
    start(config, p.lake)
    read = {j.kind: [t.table.name for t in j.tables] for j in load_jobs(p.lake)}
    assert read == {"initial": expected, "blocking": expected,
                    "incremental": ["big", "small", "mid"]}  # fmt: skip
