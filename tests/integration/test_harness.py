"""The harness's own guard: a job run in the test worker that kills the worker's Spark driver
fails its case, saying so, instead of passing and leaving every later case of the worker to fail
with connection refused (what `make slow`'s 100 MB cases did before their runs became children).

The guard reads the run's log for the words every such message of the product begins with
(`DriverDiedError.SAID`); these tests say them through the product's own message builder."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from cdc_core.apply import driver_died_in_batch
from cdc_core.config import load_pipeline
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline


def says(message: str) -> int:
    logging.getLogger("cdc_core.jobs").error(message)
    return 1


def test_a_run_here_that_kills_the_workers_driver_fails_its_case(
    tmp_path: Path, pg: PgServer
) -> None:
    p = make_pipeline(tmp_path, pg.dsn(), ["public.t"])  # the file only: nothing runs on it

    def died(argv: Sequence[str]) -> int:  # the config as the run has it, in the pipeline's home
        return says(driver_died_in_batch(load_pipeline("p", "local")))

    with pytest.raises(pytest.fail.Exception, match="killed the test worker's Spark driver"):
        p._job(died, "ingest", (), timeout=60, child=False)


def test_a_run_here_that_fails_otherwise_is_its_exit_code_and_log(
    tmp_path: Path, pg: PgServer
) -> None:
    p = make_pipeline(tmp_path, pg.dsn(), ["public.t"])  # the file only: nothing runs on it

    run = p._job(lambda argv: says("the Spark session ended"), "maintain", (), 60, child=False)

    assert run.returncode == 1
    line = json.loads(run.stderr.splitlines()[-1])  # a JSON log line, as a child's
    assert (line["level"], line["message"]) == ("ERROR", "the Spark session ended")
    assert run.args[1].endswith("jobs/maintain.py")


def test_a_database_whose_slot_a_reader_still_holds_is_dropped(pg: PgServer) -> None:
    """A reader that has closed its connection leaves the walsender holding the slot a moment
    longer; a teardown that skipped held slots then failed DROP DATABASE (which refuses a
    database with any slot, WITH (FORCE) too), and the slot it left kept WAL for the rest of the
    worker's cases. Here the reader never lets go: the teardown ends its session."""
    name = pg.create_database()
    dsn = pg.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION held FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('held_slot', 'pgoutput')")
    reader = psycopg.connect(dsn, autocommit=True, replication="database")
    try:
        reader.pgconn.send_query(
            b"START_REPLICATION SLOT held_slot LOGICAL 0/0 "
            b"(proto_version '1', publication_names 'held')"
        )
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            for _ in range(200):  # the walsender takes the slot once it reads the command
                row = admin.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = 'held_slot'"
                ).fetchone()
                if row is not None and row[0]:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the reader never took the slot")

        pg.drop_database(name)

        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            left = admin.execute(
                "SELECT (SELECT count(*) FROM pg_database WHERE datname = %s),"
                " (SELECT count(*) FROM pg_replication_slots WHERE database = %s)",
                (name, name),
            ).fetchone()
        assert left == (0, 0)
    finally:
        reader.close()
