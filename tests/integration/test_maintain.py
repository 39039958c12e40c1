"""jobs/maintain.py on a real lake: compaction, VACUUM, applied staged files, bronze retention."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.bronze import WATERMARK as BRONZE_WATERMARK
from cdc_core.bronze import append_staged, applied_end, pending_files
from cdc_core.identifiers import TableName
from cdc_core.lake_state import read_watermark
from cdc_core.silver import WATERMARK as SILVER_WATERMARK
from cdc_core.silver_table import sql_name
from cdc_core.stager import staged_files
from cdc_core.state import pruned_positions
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok as ingest
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

ITEMS, NOTES, QUIET = (TableName("public", n) for n in ("items", "notes", "quiet"))


def live_files(spark: SparkSession, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL {sql_name(path)}").first()["numFiles"])


def parquet_files(path: str) -> int:
    return sum(1 for _ in Path(path).rglob("*.parquet"))


def test_maintenance_compacts_vacuums_and_removes_only_staged_files_bronze_holds(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "CREATE TABLE notes (id int PRIMARY KEY, v text)",
        "CREATE TABLE quiet (id int PRIMARY KEY)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.items", "public.notes", "public.quiet"],
        extra="maintenance:\n  staged_retention_hours: 0\n  vacuum_retention_hours: 0\n"
              "  vacuum_retention_check: false\n"
              "capture:\n  metrics_table_interval_s: 0\n",  # a metrics commit per run
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0  # the slot, before any change
    for run in range(3):  # small commits: many small files in bronze and silver
        sql(dsn, f"INSERT INTO items SELECT g, 'v{run}' FROM generate_series({run * 10}, "
                 f"{run * 10 + 9}) g",
            f"UPDATE items SET v = 'u{run}' WHERE id < {run * 5}",
            f"INSERT INTO notes VALUES ({run}, 'n{run}')")  # fmt: skip
        ingest(p)
    applied = applied_end(spark, p.lake)
    assert len(staged_files(p.changes)) == 3
    sql(dsn, "UPDATE items SET v = 'late' WHERE id = 1", "DELETE FROM notes WHERE id = 0")
    assert p.ingest("--capture-only").returncode == 0  # staged, not yet in bronze
    waiting = [f for f in staged_files(p.changes) if f.end > applied]
    assert waiting
    silver = p.lake.silver(ITEMS)
    files_before = {path: live_files(spark, path) for path in (p.lake.bronze, silver)}
    on_disk_before = parquet_files(silver)

    run = p.maintain()

    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert any(line.startswith("bronze: ") and "files compacted into" in line for line in lines)
    assert any(line.startswith("silver public.items: ") and "vacuum removed" in line
               for line in lines), run.stdout  # fmt: skip
    assert "silver public.quiet: left alone (not created yet)" in lines
    assert any(line.startswith("metrics: ") and "files compacted into 1" in line
               for line in lines), run.stdout  # fmt: skip
    assert any(line.startswith("staged files: ") for line in lines)
    assert any(line.startswith("finished snapshot jobs: 0 removed") for line in lines), lines
    for path, before in files_before.items():
        assert live_files(spark, path) < before, f"{path}: OPTIMIZE did not compact"
        history = DeltaTable.forPath(spark, path).history().collect()
        ops = [h["operation"] for h in history]
        assert "OPTIMIZE" in ops, ops
        for h in history:
            if h["operation"] in ("OPTIMIZE", "VACUUM START", "VACUUM END"):
                assert set(json.loads(h["userMetadata"])) == {"maintenance"}  # no watermark
    assert parquet_files(silver) < on_disk_before, "VACUUM removed no file"
    assert staged_files(p.changes) == waiting, "only the files not yet in bronze stay"
    assert read_watermark(spark, p.lake.bronze, BRONZE_WATERMARK) is not None
    assert read_watermark(spark, silver, SILVER_WATERMARK) is not None

    ingest(p)  # a normal run after maintenance: picks up the waiting file, silver equals source
    assert applied_end(spark, p.lake) == waiting[-1].end
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 30
    assert assert_mirror_equals_source(spark, p.lake, dsn, NOTES) == 2


def test_bronze_retention_never_deletes_rows_silver_has_not_merged(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "CREATE TABLE notes (id int PRIMARY KEY, v text)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.items", "public.notes"],
        extra="maintenance:\n  bronze_retention_days: 0\n",  # every merged row is past it
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0  # the slot, before any change
    sql(dsn, "INSERT INTO items SELECT g, 'a' FROM generate_series(1, 20) g",
        "SELECT pg_logical_emit_message(true, 'outbox', 'x')")  # fmt: skip
    ingest(p)  # merged into silver
    sql(dsn, "UPDATE items SET v = 'b' WHERE id <= 5", "DELETE FROM items WHERE id = 20",
        "INSERT INTO notes VALUES (1, 'first')")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    append_staged(spark, p.lake, pending_files(spark, p.lake))  # in bronze, not merged
    bronze = spark.read.format("delta").load(p.lake.bronze)
    mark = read_watermark(spark, p.lake.silver(ITEMS), SILVER_WATERMARK)
    assert mark is not None
    lsn, seq = mark[SILVER_WATERMARK]
    merged = (F.col("commit_lsn") < lsn) | ((F.col("commit_lsn") == lsn) & (F.col("seq") <= seq))
    items = bronze.where(F.col("source_table") == "public.items")
    unmerged = sorted(tuple(r) for r in items.where(~merged).select("commit_lsn", "seq").collect())
    notes = bronze.where(F.col("source_table") == "public.notes").count()
    assert len(unmerged) == 6  # 5 updates and a delete
    assert notes == 1  # and notes has no mirror yet
    total = bronze.count()

    run = p.maintain()

    assert run.returncode == 0, run.stderr[-3000:]
    bronze = spark.read.format("delta").load(p.lake.bronze)
    items = bronze.where(F.col("source_table") == "public.items")
    left = sorted(tuple(r) for r in items.select("commit_lsn", "seq").collect())
    assert left == unmerged, "only the merged rows of a table are deleted"
    assert bronze.where(F.col("source_table") == "public.notes").count() == notes
    assert bronze.where(F.col("source_table") == "_messages").count() == 0
    deleted = total - bronze.count()
    assert deleted == 21  # 20 merged inserts and the message
    assert f"bronze: {deleted} rows past the retention deleted" in run.stdout

    ingest(p)  # silver takes what was left for it
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 19
    assert assert_mirror_equals_source(spark, p.lake, dsn, NOTES) == 1
    pruned = pruned_positions(p.lake)  # recorded before the deletion, for items only
    assert set(pruned) == {"public.items"}
    assert pruned["public.items"] <= (lsn, seq)

    # Dropped now, the items mirror cannot be rebuilt from bronze (its first 20 inserts are
    # gone): the run says so and names the way out, instead of building a mirror without them.
    shutil.rmtree(p.lake.silver(ITEMS))
    sql(dsn, "INSERT INTO notes VALUES (2, 'second')")
    run = p.ingest()
    assert run.returncode == 1, run.stderr[-3000:]
    error = run.stderr.strip().splitlines()[-1]
    assert "table public.items has no silver mirror" in error, error
    assert "bronze retention" in error, error
    assert "cdc snapshot --table public.items" in error, error
    assert not Path(p.lake.silver(ITEMS)).exists()  # so the snapshot below starts it over
    assert assert_mirror_equals_source(spark, p.lake, dsn, NOTES) == 2  # the others go on

    requested = p.cdc("snapshot", "--pipeline", "p", "--table", "public.items")
    assert requested.returncode == 0, requested.stderr
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert (
        "table public.items has no silver mirror: it is rebuilt from this snapshot on" in run.stderr
    )
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 19


def test_vacuum_keeps_files_for_the_configured_retention_not_delta_s_default(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Delta 4 ignores `VACUUM ... RETAIN n HOURS` unless n is 0 and applies the table's
    `delta.deletedFileRetentionDuration` (7 days) instead: a longer retention would lose files
    it promises to keep, a shorter one would keep them. VACUUM removes files no table version
    uses by their age (an unreferenced file's modification time): files of known ages in a
    mirror's directory show which retention applied."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                      extra="maintenance:\n  optimize: false\n  staged_retention_hours: 0\n"
                            "  vacuum_retention_hours: 720\n")  # fmt: skip
    ingest(p)
    silver = Path(p.lake.silver(ITEMS))

    def stray(name: str, hours_old: float) -> Path:
        path = silver / f"{name}.parquet"
        path.write_bytes(b"not referenced by any table version")
        at = time.time() - hours_old * 3600
        os.utime(path, (at, at))
        return path

    ten_days, forty_days = stray("ten-days", 240), stray("forty-days", 960)
    run = p.maintain()
    assert run.returncode == 0, run.stderr[-3000:]
    assert not forty_days.exists()
    assert ten_days.exists(), "30 days of retention asked; Delta's 7 applied"
    assert "silver public.items: vacuum removed 1 files" in run.stdout

    p.edit(
        "vacuum_retention_hours: 720", "vacuum_retention_hours: 1\n  vacuum_retention_check: false"
    )
    two_hours, half_an_hour = stray("two-hours", 2), stray("half-an-hour", 0.5)
    run = p.maintain()
    assert run.returncode == 0, run.stderr[-3000:]
    assert not two_hours.exists(), "1 hour asked; Delta's 7 days applied"
    assert not ten_days.exists()
    assert half_an_hour.exists()
    assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 10


def test_a_mirror_of_a_table_left_out_of_the_pipeline_is_still_compacted_and_vacuumed(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "CREATE TABLE notes (id int PRIMARY KEY, v text)")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.items", "public.notes"],
        extra="maintenance:\n  vacuum_retention_hours: 0\n  vacuum_retention_check: false\n",
    )  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0  # the slot, before any change
    for run in range(3):  # a small file per run
        sql(dsn, f"INSERT INTO notes VALUES ({run}, 'n{run}')")
        ingest(p)
    notes = p.lake.silver(NOTES)
    rows = sorted(spark.read.format("delta").load(notes).select("id", "v").collect())
    files, on_disk = live_files(spark, notes), parquet_files(notes)
    assert files > 1
    p.edit("'public.items', 'public.notes'", "'public.items'")

    run = p.maintain()

    assert run.returncode == 0, run.stderr[-3000:]
    line = next((x for x in run.stdout.splitlines()
                 if x.startswith("silver public.notes (not captured now): ")), None)  # fmt: skip
    assert line is not None, run.stdout
    assert f"{files} files compacted into 1" in line, line
    assert "vacuum removed" in line, line
    assert "vacuum removed 0 " not in line, line
    assert live_files(spark, notes) == 1
    assert parquet_files(notes) < on_disk
    assert sorted(spark.read.format("delta").load(notes).select("id", "v").collect()) == rows
