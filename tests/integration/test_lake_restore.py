"""docs/runbooks.md, "Restoring the lake from an older backup": the slot moved on after the
backup, so the restored `_state/stream.json` is behind the slot's confirmed position. A run
under snapshot.mode initial stops naming the slot; under when_needed it takes a new slot and a
new snapshot, and the mirror equals the source again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import (
    Pipeline,
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


def test_a_damaged_staged_file_stops_the_run_naming_it_and_the_way_out_mends_the_mirror(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A staged file cut short after it was published (a copy of the lake that stopped, a
    restore): the slot is past its changes, so the run stops naming the file and the way out,
    and lands nothing. Set aside, the next runs go on, and the incremental snapshot the error
    names brings the mirror back in line with the source."""
    dsn = pg.dsn(database)
    p, landed, already = mirrored_items(dsn, tmp_path, spark)

    sql(dsn, "DELETE FROM items WHERE id <= 10", "UPDATE items SET v = 'moved' WHERE id > 190")
    staged = p.ingest("--capture-only")
    assert staged.returncode == 0, staged.stderr[-3000:]
    [damaged] = set(p.changes.glob("*.parquet")) - already
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])

    failed = p.ingest()
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert (
        f"error: staged change file {damaged} cannot be read (Parquet magic bytes not found in "
        "footer. Either the file is corrupted or this is not a parquet file.): it was damaged "
        "after it was staged, and the slot will not send its changes again. Restore it from a "
        "backup of the lake; failing that, move it out of _staging/changes, run again, and take "
        "an incremental snapshot of each captured table (`cdc snapshot --pipeline NAME --table "
        "T`) to bring the mirrors back in line with the source\n"
    ) in failed.stderr
    assert "Traceback" not in failed.stderr
    assert {path: read(spark, path) for path in landed} == landed  # nothing landed

    damaged.rename(tmp_path / "set-aside.parquet")
    sql(dsn, "INSERT INTO items VALUES (500, 'after the damage')")
    ingest_ok(p)
    mirror = spark.read.format("delta").load(p.lake.silver(ITEMS))
    assert mirror.where("id <= 10 OR v = 'moved'").count() == 10  # the lost changes: not yet
    asked = p.cdc("snapshot", "--pipeline", "p", "--table", "public.items")
    assert asked.returncode == 0, asked.stderr
    assert "snapshot: 191 rows read, tables done: public.items" in ingest_ok(p)
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 191


def mirrored_items(
    dsn: str, home: Path, spark: SparkSession
) -> tuple[Pipeline, dict[str, tuple[int, list[object]]], set[Path]]:
    """Pipeline `p` of 200 rows of items, snapshotted and mirrored; bronze's and the mirror's
    version and rows (`read`), and the staged files there are."""
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 200) g")  # fmt: skip
    p = make_pipeline(home, dsn, ["public.items"], snapshot="initial")
    ingest_ok(p)
    landed = {path: read(spark, path) for path in (p.lake.bronze, p.lake.silver(ITEMS))}
    return p, landed, set(p.changes.glob("*.parquet"))


def read(spark: SparkSession, path: str) -> tuple[int, list[object]]:
    """A Delta table's version and rows, to tell that nothing was written to it."""
    from delta.tables import DeltaTable

    version = DeltaTable.forPath(spark, path).history(1).select("version").first()
    rows = spark.read.format("delta").load(path).drop("_file").collect()
    return int(version[0]), sorted(map(str, rows))


def test_a_staged_file_whose_pages_no_longer_decode_stops_bronze_naming_it(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Its footer intact, the file passes every check before bronze; Spark's read of its
    `message` pages is the first to fail, and used to end the run in a several-line
    "unexpected Py4JJavaError" (a traceback of Java causes)."""
    dsn = pg.dsn(database)
    p, landed, already = mirrored_items(dsn, tmp_path, spark)
    sql(dsn, "UPDATE items SET v = md5(v) || md5(v || 'x')")
    assert p.ingest("--capture-only").returncode == 0
    [damaged] = set(p.changes.glob("*.parquet")) - already
    group = pq.read_metadata(damaged).row_group(0)
    [message] = [group.column(i) for i in range(group.num_columns)
                 if group.column(i).path_in_schema == "message"]  # fmt: skip
    data = bytearray(damaged.read_bytes())
    middle = message.data_page_offset + message.total_compressed_size // 2
    data[middle : middle + 64] = bytes(64)  # a page overwritten: the footer still reads
    damaged.write_bytes(bytes(data))

    failed = p.ingest()

    assert failed.returncode == 1, failed.stderr[-3000:]
    [said] = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert said.startswith(f"error: staged change file {damaged} cannot be read ("), said
    assert said.endswith(
        "): it was damaged after it was staged, and the slot will not send its changes again. "
        "Restore it from a backup of the lake; failing that, move it out of _staging/changes, "
        "run again, and take an incremental snapshot of each captured table (`cdc snapshot "
        "--pipeline NAME --table T`) to bring the mirrors back in line with the source"
    )
    assert "Py4J" not in failed.stderr
    assert {path: read(spark, path) for path in landed} == landed  # nothing landed
