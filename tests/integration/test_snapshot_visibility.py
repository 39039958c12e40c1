"""A snapshot read and a transaction the stream already has but the read cannot see yet.

PostgreSQL writes a commit to the WAL before the transaction becomes visible to other
snapshots: in between it flushes the WAL and, with synchronous replication, waits for a standby
(as long as the standby takes). Logical decoding sends the transaction as soon as its commit is
flushed. A read whose window opens after that commit does not see the transaction, and its row
must not overwrite what the stream applied. The standby wait is how this test holds a
transaction there: `synchronous_standby_names` names a standby that never comes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.apply import apply_staged
from cdc_core.bronze import record_schema
from cdc_core.capture import capture, catch_up
from cdc_core.identifiers import TableName
from cdc_core.pg.connect import connect
from cdc_core.snapshot import catalog_descriptor
from cdc_core.snapshot_plan import plan_chunks
from cdc_core.snapshot_read import GroupRead, read_group
from cdc_core.snapshot_window import ReadView
from tests.integration.conftest import PgServer, own_server
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source
from tests.integration.test_snapshot_window import BIG, _items, _read_once
from tests.integration.test_snapshot_window import T as ITEMS

ACCOUNTS = TableName("public", "accounts")


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server of this file's own: the test makes commits wait for a standby."""
    with own_server("visibility", "the snapshot visibility test") as server:
        yield server


def _waiting_commit(
    dsn: str, statement: str = "UPDATE accounts SET v = 'new' WHERE id = 1"
) -> tuple[threading.Thread, list[BaseException]]:
    """`statement`, then COMMIT, which waits for the standby; returns once it waits."""
    errors: list[BaseException] = []

    def commit() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(statement)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()
            if row and row[0]:
                return thread, errors
            time.sleep(0.1)
    raise AssertionError("the commit does not wait for the standby")


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE accounts (id int PRIMARY KEY, v text)",
        # no key: the read replaces the mirror's content, the update applied before included
        "CREATE TABLE accounts (id int, v text); ALTER TABLE accounts REPLICA IDENTITY FULL",
    ],
    ids=["keyed", "keyless"],
)
def test_a_read_does_not_undo_a_change_the_stream_has_and_it_cannot_see(
    server: PgServer, tmp_path: Path, spark: SparkSession, ddl: str
) -> None:
    database = server.create_database("visibility")
    dsn = server.dsn(database)
    admin = server.dsn()
    try:
        sql(dsn, ddl, "INSERT INTO accounts VALUES (1, 'old'), (2, 'two')")
        p = make_pipeline(tmp_path, dsn, [ACCOUNTS.qualified], snapshot="initial")
        run = p.ingest()
        assert run.returncode == 0, run.stderr[-3000:]
        sql(admin, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
            "SELECT pg_reload_conf()")  # fmt: skip
        thread, errors = _waiting_commit(dsn)
        try:
            run = p.ingest()  # the stream has the update: flushed, not yet visible
            assert run.returncode == 0, run.stderr[-3000:]
            requested = p.cdc("snapshot", "--pipeline", "p", "--table", ACCOUNTS.qualified)
            assert requested.returncode == 0, requested.stderr
            run = p.ingest()  # the read cannot see the update
            assert run.returncode == 0, run.stderr[-3000:]  # nor waits for the standby
        finally:
            sql(admin, "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
            thread.join(timeout=30)
        assert not errors, errors
        run = p.ingest()
        assert run.returncode == 0, run.stderr[-3000:]
        assert assert_mirror_equals_source(spark, p.lake, dsn, ACCOUNTS) == 2
    finally:
        server.drop_database(database)


def test_a_move_the_first_read_had_running_though_it_was_flushed_is_read_where_it_went(
    server: PgServer, tmp_path: Path, spark: SparkSession
) -> None:
    """The other way round: a key change flushed before the first group's read, still running
    for its snapshot (waiting for the standby), takes a row out of the second group's chunk to
    a key the first read passed, without resending its out-of-line value. The second read sees
    the move, so it does not find the row; it must read the row where it went, though the move
    is in the stream before the first read's low watermark."""
    database = server.create_database("moved_early")
    dsn = server.dsn(database)
    admin = server.dsn()
    try:
        p, config = _items(dsn, tmp_path, (60,))
        with connect(config.pipeline.source.dsn, values=True) as conn:
            plan = plan_chunks(conn, ITEMS, chunk_size=50)
            shape = catalog_descriptor(conn, ITEMS)
        assert len(plan.chunks) == 2, plan

        def read(group: int, since: int | None) -> ReadView:
            view, _, _ = read_group(
                spark, p.lake, config.pipeline.source.dsn,
                GroupRead("job-1", "incremental", "p", database, ITEMS, plan,
                          plan.chunks[group : group + 1], group, None, None, 1000, since=since),
                catch_up=lambda at: catch_up(config, p.lake, at),
            )  # fmt: skip
            return view

        sql(admin, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
            "SELECT pg_reload_conf()")  # fmt: skip
        try:
            thread, errors = _waiting_commit(dsn, "UPDATE items SET id = -60 WHERE id = 60")
            first = read(0, None)
        finally:
            sql(admin, "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
            thread.join(timeout=30)
        assert not errors, errors
        assert first.unseen_from is not None
        assert first.unseen_from < first.before  # the move: flushed before, unseen by the read
        read(1, first.unseen_from.value)  # as read_jobs passes it on

        big = _read_once(spark, p)
        assert set(big) == (set(range(1, 101)) - {60}) | {-60}
        assert big[-60] == BIG + "60"

        record_schema(p.lake, shape, first.position.value)
        capture(config, p.lake)
        apply_staged(spark, p.lake, config)
        assert assert_mirror_equals_source(spark, p.lake, dsn, ITEMS) == 100
    finally:
        server.drop_database(database)
