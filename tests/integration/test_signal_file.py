"""The signal file end to end: a line of `signal.file` snapshots a table incrementally, the
mirror ends equal to the source, and the line, taken out of the file, is not carried out again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.signals import signal_table_ddl
from cdc_core.snapshot import load_jobs
from cdc_core.start import start
from cdc_core.state import signal_batch_file
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

ITEMS = TableName("public", "items")


@pytest.mark.slow
def test_a_line_of_the_signal_file_snapshots_a_table_once(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g",
    )
    p = make_pipeline(
        tmp_path, dsn, [ITEMS.qualified], snapshot="no_data",
        snapshot_extra="signal.enabled.channels: file\nchunk.size: 100\n",
    )  # fmt: skip
    ingest_ok(p)  # no_data: the slot, and none of the rows written before it
    assert load_jobs(p.lake) == []
    sql(dsn, "UPDATE items SET v = 'changed' WHERE id <= 10", "DELETE FROM items WHERE id > 490")
    signals = p.home / "pipelines" / "file-signals.txt"  # Debezium's name, next to p.yaml
    execute = {"data-collections": ["public.items"], "type": "incremental"}
    signals.write_text(
        json.dumps({"id": "f-1", "type": "execute-snapshot", "data": execute}) + "\n"
        + "not a signal\n"
    )  # fmt: skip

    ingest_ok(p)
    [job] = load_jobs(p.lake)
    assert (job.kind, job.origin, job.finished) == ("incremental", "signal f-1", True)
    assert signals.read_text() == "", "the lines read are taken out of the file"
    assert not signal_batch_file(p.lake).exists()
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 490

    ingest_ok(p)
    assert len(load_jobs(p.lake)) == 1, "a signal taken from the file is not carried out twice"
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 490


def test_the_enabled_channels_say_which_signals_are_read(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        signal_table_ddl(TableName("public", "debezium_signal")))  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, [ITEMS.qualified],
        snapshot_extra="signal.data.collection: public.debezium_signal\n"
        "signal.enabled.channels: file\n",
    )  # fmt: skip
    start(load_pipeline("p", "local", home=tmp_path), p.lake)  # the slot
    execute = json.dumps({"data-collections": ["public.items"]})
    sql(dsn, f"INSERT INTO debezium_signal VALUES ('t-1', 'execute-snapshot', '{execute}')")
    signals = p.home / "pipelines" / "file-signals.txt"
    signals.write_text(f'{{"id": "f-1", "type": "execute-snapshot", "data": {execute}}}\n')

    start(load_pipeline("p", "local", home=tmp_path), p.lake)
    assert [j.origin for j in load_jobs(p.lake)] == ["signal f-1"]
    p.edit("signal.enabled.channels: file", "signal.enabled.channels: source,file")
    start(load_pipeline("p", "local", home=tmp_path), p.lake)
    assert sorted(j.origin for j in load_jobs(p.lake)) == ["signal f-1", "signal t-1"]
