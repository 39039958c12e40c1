"""DBLog's window, raced on purpose: a transaction the read did not see commits between the
read's snapshot and its place in the stream. Its delete drops the read's row, its updates are
applied to it (an unchanged TOASTed value stays the read's), and bronze replays to the source.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core import faults
from cdc_core.apply import apply_staged
from cdc_core.bronze import record_schema
from cdc_core.capture import capture, catch_up
from cdc_core.config import Config, Dsn, load_pipeline
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.lsn import Lsn
from cdc_core.pg.connect import connect
from cdc_core.snapshot import catalog_descriptor
from cdc_core.snapshot_plan import plan_chunks
from cdc_core.snapshot_read import (
    GroupRead,
    _leave_to_later_groups,
    read_group,
    shared_snapshot,
)
from cdc_core.snapshot_window import Overtaken, ReadView
from tests.integration.conftest import PgServer
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

T = TableName("public", "items")
BIG = "x" * 20000  # stored out of line: an update that does not touch it does not resend it


def _items(dsn: str, tmp_path: Path, toasted: tuple[int, ...]) -> tuple[Pipeline, Config]:
    """`items` (ids 1-100; `toasted` with a value stored out of line) and a pipeline whose slot
    streams its changes from here on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text, big text)")
        conn.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO items SELECT i, 'v' || i, NULL FROM generate_series(1, 100) i")
        conn.execute("UPDATE items SET big = %s || id WHERE id = ANY(%s)", (BIG, list(toasted)))
    p = make_pipeline(tmp_path, dsn, [T.qualified])
    assert p.ingest("--capture-only").returncode == 0
    return p, load_pipeline("p", "local", home=tmp_path)


def _read_once(spark: SparkSession, p: Pipeline) -> dict[int, str | None]:
    """The snapshot's reads in bronze, id -> big, each id read once."""
    reads = (
        spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r")
        .select(F.get_json_object("after", "$.id").cast("int").alias("id"),
                F.get_json_object("after", "$.big").alias("big")).collect()
    )  # fmt: skip
    ids = [r["id"] for r in reads]
    assert len(ids) == len(set(ids)), sorted(ids)  # every row read once
    return {r["id"]: r["big"] for r in reads}


def test_a_transaction_the_read_missed_overtakes_its_rows(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    p, config = _items(dsn, tmp_path, (9, 10))
    lake = p.lake

    missed = psycopg.connect(dsn)  # a transaction in flight when the read takes its snapshot
    missed.execute("UPDATE items SET v = 'new' WHERE id = 5")
    missed.execute("DELETE FROM items WHERE id = 7")
    missed.execute("UPDATE items SET v = 'toast kept' WHERE id = 9")
    missed.execute("UPDATE items SET id = 1010 WHERE id = 10")  # a key change: the old key goes
    missed.execute("INSERT INTO items VALUES (1000, 'inserted', NULL)")
    row = missed.execute("SELECT txid_current() % 4294967296").fetchone()
    assert row is not None
    xid = int(row[0])

    with connect(config.pipeline.source.dsn, values=True) as conn:
        plan = plan_chunks(conn, T, chunk_size=1000)
        shape = catalog_descriptor(conn, T)
    read = GroupRead(
        "job-1", "incremental", "p", database, T, plan, plan.chunks, 0, None, None, 1000
    )
    caught: list[Lsn] = []
    with faults.hooked("snapshot.after_export", missed.commit):
        view, rows, _ = read_group(
            spark, lake, config.pipeline.source.dsn, read,
            catch_up=lambda at: caught.append(at) or catch_up(config, lake, at),
        )  # fmt: skip
    missed.close()
    assert isinstance(view, ReadView)
    assert not view.sees(xid), "the transaction was in flight when the snapshot was taken"
    assert caught == [view.position]

    reads = {
        r["id"]: r for r in spark.read.format("delta").load(lake.bronze)
        .where(F.col("op") == "r").select(F.get_json_object("after", "$.id").cast("int").alias("id"),
                                          F.get_json_object("after", "$.v").alias("v"),
                                          F.get_json_object("after", "$.big").alias("big")).collect()
    }  # fmt: skip
    assert rows == len(reads) == 99  # 7 deleted; 10 moved to 1010; 1000 not seen
    assert 7 not in reads
    assert 10 not in reads
    assert reads[1010]["big"] == BIG + "10"  # the move did not resend it: the read had it
    assert reads[5]["v"] == "new"
    assert reads[9]["v"] == "toast kept"
    assert reads[9]["big"] == BIG + "9"  # not resent by the update: the read's value stands
    assert reads[6]["v"] == "v6"

    record_schema(lake, shape, view.position.value)
    capture(config, lake)
    apply_staged(spark, lake, config)
    assert assert_mirror_equals_source(spark, lake, dsn, T) == 100


def test_a_row_moved_to_a_key_a_later_group_reads_is_left_to_that_groups_read(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A key change the read missed moves the read's row, unless the new key is in a chunk a
    later group reads: that group reads the row itself, and moved here too it would land twice
    (CI, 2026-11-30: an order renumbered to a new id was read moved, then by the last chunk)."""
    dsn = pg.dsn(database)
    p, config = _items(dsn, tmp_path, (10, 12))
    lake = p.lake
    with connect(config.pipeline.source.dsn, values=True) as conn:
        plan = plan_chunks(conn, T, chunk_size=50)
        shape = catalog_descriptor(conn, T)
    assert len(plan.chunks) == 2, plan

    missed = psycopg.connect(dsn)  # in flight when the first group's read takes its snapshot
    missed.execute("UPDATE items SET id = 1010 WHERE id = 10")  # into the later group's chunk
    missed.execute("UPDATE items SET id = -12 WHERE id = 12")  # within this group's chunk
    row = missed.execute("SELECT txid_current() % 4294967296").fetchone()
    assert row is not None

    def read(group: int) -> tuple[ReadView, int]:
        chunks = plan.chunks[group : group + 1]
        view, rows, _ = read_group(
            spark, lake, config.pipeline.source.dsn,
            GroupRead("job-1", "incremental", "p", database, T, plan, chunks, group, None, None,
                      1000),
            catch_up=lambda at: catch_up(config, lake, at),
        )  # fmt: skip
        assert isinstance(view, ReadView)
        return view, rows

    with faults.hooked("snapshot.after_export", missed.commit):
        first, _ = read(0)
    missed.close()
    assert not first.sees(int(row[0])), "the transaction was in flight for the first read"
    read(1)

    big = _read_once(spark, p)
    assert set(big) == (set(range(1, 101)) - {10, 12}) | {1010, -12}
    assert big[-12] == BIG + "12"  # moved within the read: the value the move did not resend
    assert big[1010] == BIG + "10"  # read whole by the later group

    record_schema(lake, shape, first.position.value)
    capture(config, lake)
    apply_staged(spark, lake, config)
    assert assert_mirror_equals_source(spark, lake, dsn, T) == 100


def test_a_row_moved_out_of_a_chunk_not_yet_read_into_one_read_before_is_read_where_it_went(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A key change the second group's read saw took rows out of its chunk to keys the first
    group had read before them, without resending an out-of-line value: the mirror has them
    only from the stream, without that value, and no chunk would read them. The second read
    reads them where they went (a chain of moves followed to its end), but not a row the
    first read found there already, nor one whose move resent everything."""
    dsn = pg.dsn(database)
    p, config = _items(dsn, tmp_path, (60, 70, 90))
    lake = p.lake
    with connect(config.pipeline.source.dsn, values=True) as conn:
        plan = plan_chunks(conn, T, chunk_size=50)
        shape = catalog_descriptor(conn, T)
    assert len(plan.chunks) == 2, plan

    def read(group: int, since: int | None) -> ReadView:
        chunks = plan.chunks[group : group + 1]
        view, _, _ = read_group(
            spark, lake, config.pipeline.source.dsn,
            GroupRead("job-1", "incremental", "p", database, T, plan, chunks, group, None, None,
                      1000, since=since),
            catch_up=lambda at: catch_up(config, lake, at),
        )  # fmt: skip
        assert isinstance(view, ReadView)
        return view

    def execute(*statements: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    # inside the first read's window, seen by it: it reads -90 whole
    seen = "UPDATE items SET id = -90 WHERE id = 90"
    with faults.hooked("window.low_watermark", lambda: execute(seen)):
        first = read(0, None)
    execute(
        "UPDATE items SET id = -60 WHERE id = 60",  # after the first read: nothing has big
        "UPDATE items SET id = -70 WHERE id = 70",
        "UPDATE items SET id = -71 WHERE id = -70",  # moved on: read where it ends
        "UPDATE items SET id = -85 WHERE id = 85",  # no out-of-line value: the move sent all
    )
    read(1, first.before.value)

    big = _read_once(spark, p)
    assert set(big) == (set(range(1, 101)) - {60, 70, 85, 90}) | {-90, -60, -71}
    assert (big[-60], big[-71], big[-90]) == (BIG + "60", BIG + "70", BIG + "90")

    record_schema(lake, shape, first.position.value)
    capture(config, lake)
    apply_staged(spark, lake, config)
    assert assert_mirror_equals_source(spark, lake, dsn, T) == 100


def test_which_moves_are_left_to_later_groups_is_the_servers_to_say(
    pg: PgServer, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys compared as the chunks' reads compare them (text by the column's collation; a %
    in a chunk's bound is text, not a parameter); a key the server refuses as a row of the
    table leaves every move as it was, with a warning."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE named (name text COLLATE "C" PRIMARY KEY, n int)')
        conn.execute("INSERT INTO named SELECT 'k%' || i, i FROM generate_series(10, 99) i")
        conn.execute("CREATE TABLE numbered (id int PRIMARY KEY)")
        conn.execute("INSERT INTO numbered SELECT generate_series(1, 90)")

    def first_group(conn: psycopg.Connection[tuple[object, ...]], name: str) -> GroupRead:
        plan = plan_chunks(conn, TableName("public", name), chunk_size=45)
        assert len(plan.chunks) == 2, plan
        return GroupRead("job-1", "incremental", "p", database, plan.table, plan,
                         plan.chunks[:1], 0, None, None, 1000)  # fmt: skip

    with connect(Dsn(dsn), values=True) as conn:
        named, numbered = first_group(conn, "named"), first_group(conn, "numbered")
        conn.execute("BEGIN")
        moves = {("Z",): (("k%10",), {"name": "Z", "n": "1"}),  # "Z" < "k" in "C": this group
                 ("z",): (("k%11",), {"name": "z"}),  # after every "k..": the later group's
                 ("k%12x",): (("k%12",), {"n": "5"})}  # the key not resent: it stays  # fmt: skip
        newer = Overtaken(dropped={("k%10",), ("k%11",), ("k%12",)}, moved=dict(moves))
        left = _leave_to_later_groups(conn, named, newer)
        assert set(left.moved) == {("Z",), ("k%12x",)}
        assert left.dropped == newer.dropped  # the read's rows at the old keys go either way

        odd = Overtaken(dropped={("1",), ("2",)},
                        moved={("500",): (("1",), {"id": "500"}), ("x",): (("2",), {"id": "x"})})  # fmt: skip
        assert set(_leave_to_later_groups(conn, numbered, odd).moved) == {("500",), ("x",)}
        assert "later group may read them again" in caplog.text
        assert "invalid input syntax for type integer" in caplog.text
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the read's transaction goes on
        odd.moved.pop(("x",))
        assert _leave_to_later_groups(conn, numbered, odd).moved == {}


def _queued(dsn: str, ddl: str) -> threading.Thread:
    """`ddl` run on a thread of its own, returned once it waits for a lock (the read's)."""
    thread = threading.Thread(target=sql, args=(dsn, ddl))
    thread.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(200):
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query = %s", (ddl,),
            ).fetchone()  # fmt: skip
            if waiting and waiting[0]:
                return thread
            time.sleep(0.05)
    raise AssertionError(f"{ddl!r} did not queue behind the read's lock")


@pytest.mark.parametrize("point", ["snapshot.after_export", "window.high_watermark"])
def test_a_ddl_queued_behind_a_read_goes_first_and_the_group_is_read_again(  # noqa: PLR0917 - fixtures
    point: str, pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """An ALTER TABLE waits for the read's lock, and the chunk readers, queued behind it, for
    the ALTER: each side waited for the other (and the application's sessions behind the
    ALTER) until source.query_timeout_s. At `snapshot.after_export` Spark has not yet asked
    for the chunks' columns; at `window.high_watermark` it has, and reads them in the write."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text, gone text)")
        conn.execute(
            "INSERT INTO items SELECT i, 'v' || i, 'g' || i FROM generate_series(1, 100) i"
        )
    p = make_pipeline(tmp_path, dsn, [T.qualified])
    assert p.ingest("--capture-only").returncode == 0
    config = load_pipeline("p", "local", home=tmp_path)
    lake = p.lake
    with connect(config.pipeline.source.dsn, values=True) as conn:
        plan = plan_chunks(conn, T, chunk_size=1000)
    read = GroupRead(
        "job-1", "incremental", "p", database, T, plan, plan.chunks, 0, None, None, 1000
    )
    ddl: list[threading.Thread] = []

    def queue_ddl() -> None:  # once: the read's next attempt finds the table altered
        if not ddl:
            alter = "ALTER TABLE items ADD COLUMN added int DEFAULT 7, DROP COLUMN gone"
            ddl.append(_queued(dsn, alter))

    with faults.hooked(point, queue_ddl), caplog.at_level(logging.WARNING, "cdc_core.snapshot"):
        view, rows, shape = read_group(
            spark, lake, config.pipeline.source.dsn, read,
            catch_up=lambda at: catch_up(config, lake, at),
        )  # fmt: skip
    ddl[0].join(timeout=60)
    assert not ddl[0].is_alive()
    assert "the read gave way to it and starts again (attempt 2 of 5)" in caplog.text
    assert rows == 100
    assert [c.name for c in shape.columns] == ["id", "v", "added"]  # the table as it is now
    after = spark.read.format("delta").load(lake.bronze).where(F.col("op") == "r")
    assert {r[0] for r in after.select(F.get_json_object("after", "$.added")).collect()} == {"7"}
    assert after.where(F.col("after").contains('"gone"')).count() == 0

    record_schema(lake, shape, view.position.value)
    capture(config, lake)
    apply_staged(spark, lake, config)
    assert assert_mirror_equals_source(spark, lake, dsn, T) == 100


def test_a_column_dropped_after_the_shared_snapshot_was_taken_is_named(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Groups of a pipeline that does not stream read under one snapshot taken at the start.
    Its catalog names the columns a read selects; the table has today's. A column dropped
    since is refused by name (the read used to fail in Spark, on a column that "does not
    exist"); a column added since is not read: the rows are as of the snapshot."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE narrowed (id int PRIMARY KEY, gone text)",
        "CREATE TABLE widened (id int PRIMARY KEY, v text)",
        "INSERT INTO narrowed SELECT g, 'g' FROM generate_series(1, 10) g",
        "INSERT INTO widened SELECT g, 'v' FROM generate_series(1, 10) g")  # fmt: skip
    narrowed, widened = TableName("public", "narrowed"), TableName("public", "widened")
    p = make_pipeline(tmp_path, dsn, [narrowed.qualified, widened.qualified])
    config = load_pipeline("p", "local", home=tmp_path)
    source = config.pipeline.source.dsn

    def group(table: TableName) -> GroupRead:
        with connect(source, values=True) as conn:
            plan = plan_chunks(conn, table, chunk_size=1000)
        return GroupRead("job-1", "initial", "p", database, table, plan, plan.chunks, 0, None,
                         None, 1000)  # fmt: skip

    reads = {t: group(t) for t in (narrowed, widened)}
    with shared_snapshot(source) as shared:
        sql(dsn, "ALTER TABLE narrowed DROP COLUMN gone",
            "ALTER TABLE widened ADD COLUMN added int DEFAULT 7")  # fmt: skip
        with pytest.raises(TerminalError) as refused:
            read_group(spark, p.lake, source, reads[narrowed], catch_up=None, shared=shared)
        _, rows, shape = read_group(
            spark, p.lake, source, reads[widened], catch_up=None, shared=shared
        )
    assert str(refused.value) == (
        'snapshot of public.narrowed: column "gone" does not exist, though the snapshot every '
        "table is read under has it: it was dropped or renamed since; run again for a new "
        "snapshot"
    )
    assert rows == 10
    assert [c.name for c in shape.columns] == ["id", "v"]


def _joined_read(dsn: str, database: str, tmp_path: Path) -> tuple[Pipeline, GroupRead]:
    """`items`, read through a SELECT that joins `regions` and leaves the closed one's out."""
    sql(dsn, "CREATE TABLE regions (id int PRIMARY KEY, name text)",
        "INSERT INTO regions VALUES (1, 'north'), (2, 'south'), (3, 'east'), (4, 'closed')",
        "CREATE TABLE items (id int PRIMARY KEY, v text, region_id int)",
        "INSERT INTO items SELECT i, 'v' || i, 1 + i % 4 FROM generate_series(1, 100) i")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, [T.qualified])
    assert p.ingest("--capture-only").returncode == 0
    with connect(
        load_pipeline("p", "local", home=tmp_path).pipeline.source.dsn, values=True
    ) as conn:
        plan = plan_chunks(conn, T, chunk_size=30)
    select = (
        "SELECT i.* FROM public.items i JOIN public.regions r ON r.id = i.region_id "
        "WHERE r.name <> 'closed'"
    )
    return p, GroupRead(
        "job-1", "blocking", "p", database, T, plan, plan.chunks, 0, None, select, 1000
    )


@pytest.mark.parametrize("other", ["held", "queued"])
def test_a_read_that_joins_another_table_waits_for_its_lock_and_gives_way_to_a_queued_ddl(  # noqa: PLR0917 - fixtures
    other: str, pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A read of a SELECT that joins another table (select.statement.overrides). `held`:
    another session holds that table's ACCESS EXCLUSIVE lock for 3 s (a short rewrite). No
    cycle: the read waits for it (the chunk readers used to give way to it, a second after
    each attempt, and a hold of some 15 s ended the run). `queued`: an ALTER TABLE of the
    joined table queues behind the read's lock on it, and the readers behind the ALTER: a
    cycle, which the read gives way to, as it does for its own table's."""
    dsn = pg.dsn(database)
    p, read = _joined_read(dsn, database, tmp_path)
    config = load_pipeline("p", "local", home=tmp_path)
    holder = psycopg.connect(dsn)
    others: list[threading.Thread] = []  # the holder's commit, or the queued ALTER

    def hold() -> None:  # once, before the read looks at the joined table
        if others:
            return
        holder.execute("LOCK TABLE regions IN ACCESS EXCLUSIVE MODE")
        others.append(threading.Timer(3.0, holder.commit))
        others[0].start()

    def queue_ddl() -> None:  # once, while the read holds the joined table
        if not others:
            others.append(_queued(dsn, "ALTER TABLE regions ADD COLUMN c int"))

    point, hook = ("snapshot.after_export", hold) if other == "held" else (
        "window.high_watermark", queue_ddl)  # fmt: skip
    started = time.monotonic()
    try:
        with faults.hooked(point, hook), caplog.at_level(logging.WARNING, "cdc_core.snapshot"):
            _, rows, _ = read_group(spark, p.lake, config.pipeline.source.dsn, read, catch_up=None)
    finally:
        for t in others:
            t.join(timeout=60)
        holder.close()
    assert not others[0].is_alive()
    assert rows == 75  # the closed region's items are not read
    if other == "held":
        assert "gave way" not in caplog.text
        assert time.monotonic() - started >= 3.0  # the read waited for the lock
    else:
        assert "the read gave way to it and starts again (attempt 2 of 5)" in caplog.text
    ids = spark.read.format("delta").load(p.lake.bronze).where(F.col("op") == "r").select(
        F.get_json_object("after", "$.id").cast("int")).collect()  # fmt: skip
    assert sorted(r[0] for r in ids) == [i for i in range(1, 101) if i % 4 != 3]


def test_a_table_a_read_joins_emptied_after_the_shared_snapshot_was_taken_is_refused(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """TRUNCATE is not MVCC-safe: under the shared snapshot, taken before it, the joined table
    reads empty, and the join would land no row at all. The read's own table was refused so;
    now so is every table its SELECT reads."""
    dsn = pg.dsn(database)
    p, read = _joined_read(dsn, database, tmp_path)
    config = load_pipeline("p", "local", home=tmp_path)
    with shared_snapshot(config.pipeline.source.dsn) as shared:
        sql(dsn, "TRUNCATE regions")
        with pytest.raises(TerminalError, match=r"snapshot of public\.items: a table its read "
                           r"joins or selects from was emptied or rewritten .*: regions\)"):  # fmt: skip
            read_group(spark, p.lake, config.pipeline.source.dsn, read, catch_up=None,
                       shared=shared)  # fmt: skip
    assert not (Path(p.lake.bronze) / "_delta_log").exists()  # nothing landed
