"""A captured table renamed or moved to another schema: pgoutput sends its changes under the
name it had when each was made, and the pipeline follows the table by its oid, so none is lost.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.capture import capture
from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.start import start
from tests.integration.conftest import PgServer
from tests.integration.ground_truth import staged_changes
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source


def test_changes_made_while_a_table_had_another_name_are_staged_as_its_own(
    pg: PgServer, database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", "CREATE SCHEMA elsewhere",
        "CREATE TABLE other (id int PRIMARY KEY)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    sql(dsn, "INSERT INTO items VALUES (1, 'before')")
    assert capture(config, p.lake).changes == 1
    sql(dsn,  # a rename and a move, each undone, with changes under every name
        "ALTER TABLE items RENAME TO items_old", "INSERT INTO items_old VALUES (2, 'renamed')",
        "UPDATE items_old SET v = 'renamed' WHERE id = 1",
        "ALTER TABLE items_old SET SCHEMA elsewhere",
        "INSERT INTO elsewhere.items_old VALUES (3, 'moved')",
        "ALTER TABLE elsewhere.items_old SET SCHEMA public",
        "ALTER TABLE items_old RENAME TO items", "INSERT INTO items VALUES (4, 'back')")  # fmt: skip

    start(config, p.lake)
    with caplog.at_level(logging.WARNING, logger="cdc_core.reader"):
        summary = capture(config, p.lake)

    staged = staged_changes(p.changes)
    assert [(c.table, c.op, c.new) for c in staged[1:]] == [
        ("public.items", "c", (("id", "2"), ("v", "renamed"))),
        ("public.items", "u", (("id", "1"), ("v", "renamed"))),
        ("public.items", "c", (("id", "3"), ("v", "moved"))),
        ("public.items", "c", (("id", "4"), ("v", "back"))),
    ]
    assert summary.changes == 4
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "table public.items is called public.items_old at LSN" in warned
    assert "table public.items is called elsewhere.items_old at LSN" in warned


def test_a_table_renamed_for_good_stops_the_next_run_which_names_the_way_back(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Its start stops (exit 1) before any change is read, naming the new name; renamed back as
    the fix says, the next run captures the changes made under the other name."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", "CREATE SCHEMA archive")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "ALTER TABLE items RENAME TO goods", "ALTER TABLE goods SET SCHEMA archive",
        "INSERT INTO archive.goods VALUES (1, 'renamed')")  # fmt: skip

    run = p.ingest("--capture-only")

    assert run.returncode == 1, run.stderr[-3000:]
    assert (
        f'table public.items: public.items does not exist; publication "pub_{p.slot}" publishes '
        "archive.goods, which source.tables does not name: public.items renamed or moved to it?"
    ) in run.stderr, run.stderr[-3000:]
    assert staged_changes(p.changes) == []
    doctor = p.cdc("doctor", "--pipeline", "p")
    assert (
        'ALTER TABLE "archive"."goods" SET SCHEMA "public"; '
        'ALTER TABLE "public"."goods" RENAME TO "items"; (its changes made meanwhile are then '
        "captured as public.items's)"
    ) in doctor.stdout + doctor.stderr, doctor.stdout + doctor.stderr

    sql(dsn, "ALTER TABLE archive.goods SET SCHEMA public", "ALTER TABLE goods RENAME TO items")
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr[-3000:]
    assert [(c.table, c.op, c.new) for c in staged_changes(p.changes)] == [
        ("public.items", "c", (("id", "1"), ("v", "renamed")))
    ]


@pytest.mark.slow
def test_a_table_renamed_and_renamed_back_between_runs_is_mirrored_exactly(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 20) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial")
    ingest_ok(p)
    sql(dsn, "ALTER TABLE items RENAME TO items_old",
        "UPDATE items_old SET v = 'renamed' WHERE id <= 5", "DELETE FROM items_old WHERE id > 15",
        "INSERT INTO items_old VALUES (100, 'new')", "ALTER TABLE items_old RENAME TO items")  # fmt: skip

    ingest_ok(p)

    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 16
