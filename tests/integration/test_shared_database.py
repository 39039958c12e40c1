"""Two pipelines capturing the same table from one database, each with its own slot and lake:
what one writes into the WAL for itself (a reset marker) reaches the other's slot too, and the
other leaves it alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

T = TableName("public", "items")


@pytest.mark.slow
def test_one_pipelines_reset_leaves_another_pipelines_mirror_alone(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")  # fmt: skip
    a, b = (make_pipeline(tmp_path / n, dsn, [T.qualified], snapshot="initial") for n in "ab")
    assert a.slot != b.slot
    for p in (a, b):
        ingest_ok(p)
        assert assert_mirror_equals_source(spark, p.lake, dsn, T) == 20

    # A rebuilds its dropped mirror: its run writes a reset marker, which B's slot gets too
    shutil.rmtree(a.lake.silver(T))
    requested = a.cdc("snapshot", "--pipeline", "p", "--table", T.qualified)
    assert requested.returncode == 0, requested.stderr
    assert "rebuilt from this snapshot on" in a.ingest().stderr
    sql(dsn, "UPDATE items SET v = 'after' WHERE id = 1")  # B's run has a change for the table
    for p in (a, b):
        ingest_ok(p)
        assert assert_mirror_equals_source(spark, p.lake, dsn, T) == 20, p.slot


def test_a_pipeline_of_the_same_name_pointed_at_another_s_root_is_stopped_not_snapshotted_into_it(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Two checkouts of one project (dev and prod, say) both hold pipelines/p.yaml, with their
    own slots and one target.root. The second's run used to take the first's stored position
    for a lost one of its own; under when_needed it snapshotted into the first's lake, and
    each then found the other's position there."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")  # fmt: skip
    root = str(tmp_path / "shared")
    first, second = (make_pipeline(tmp_path / n, dsn, [T.qualified], snapshot="initial", root=root)
                     for n in ("first", "second"))  # fmt: skip
    ingest_ok(first)
    for mode in ("initial", "when_needed"):
        second.edit("mode: initial", f"mode: {mode}")
        refused = second.ingest()
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert (f"holds a lake read through replication slot {first.slot}, which is still on "
                f"the source, and source.slot is {second.slot}") in refused.stderr  # fmt: skip
        assert "give each a target.root of its own" in refused.stderr
        second.edit(f"mode: {mode}", "mode: initial")
    sql(dsn, "UPDATE items SET v = 'x' WHERE id = 1", "DELETE FROM items WHERE id = 2")
    ingest_ok(first)  # its lake and position are its own still
    assert_mirror_equals_source(spark, Lake(root), dsn, T)
