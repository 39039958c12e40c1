"""docs/runbooks.md, "Restoring the lake from an older backup": the slot moved on after the
backup, so the restored `_state/stream.json` is behind the slot's confirmed position. A run
under snapshot.mode initial stops naming the slot; under when_needed it takes a new slot and a
new snapshot, and the mirror equals the source again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import (
    ingest_ok,
    make_pipeline,
    resnapshot_when_needed,
    sql,
)
from tests.integration.mirror import assert_mirror_equals_source

ITEMS = TableName("public", "items")


@pytest.mark.slow
def test_a_lake_restored_from_an_older_backup_is_detected_and_resnapshotted(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 200) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    ingest_ok(p)
    lake, backup = tmp_path / "lake", tmp_path / "backup"
    shutil.copytree(lake, backup)  # the pipeline is stopped: a consistent backup

    sql(dsn, "DELETE FROM items WHERE id <= 10", "UPDATE items SET v = 'moved' WHERE id > 190")
    ingest_ok(p)  # the slot moves on past the backup's stored position
    shutil.rmtree(lake)
    shutil.copytree(backup, lake)  # the restore: those changes are in no staged file now
    sql(dsn, "INSERT INTO items VALUES (500, 'after the restore')")

    failed = p.ingest()
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert (
        f"error: pipeline p: replication slot {p.slot} is ahead of this pipeline's stored "
        "position (it was recreated" in failed.stderr
    )
    assert "Set snapshot.mode: when_needed" in failed.stderr

    out = resnapshot_when_needed(p)
    assert "snapshot: 191 rows read, tables done: public.items" in out
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 191
