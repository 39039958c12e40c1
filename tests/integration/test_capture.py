"""Capture end to end: the slot's committed changes are staged exactly once, in commit order.

Ground truth is a second slot decoded by test_decoding (see ground_truth.py); ingest runs as
users run it, `python jobs/ingest.py --pipeline NAME`, in a child process.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from cdc_core import faults
from cdc_core.capture import _Recording, capture
from cdc_core.config import Dsn, load_pipeline
from cdc_core.errors import SetupError, TerminalError, TransientError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.pg.connect import connect
from cdc_core.pg.local import throwaway_cluster
from cdc_core.pg.replication import CaughtUp, Checkpoint, SqlSource, StreamSource
from cdc_core.pg.slot import slot_state
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, run_workload
from cdc_core.snapshot import load_jobs
from cdc_core.stager import iter_rows, read_metadata, staged_files
from cdc_core.start import start
from cdc_core.state import read_json, stream_file
from tests.conftest import unavailable
from tests.integration.conftest import PgServer
from tests.integration.ground_truth import comparable, create_truth_slot, read_truth, staged_changes
from tests.integration.harness import Pipeline, make_pipeline, sql

ROOT = Path(__file__).resolve().parents[2]
SHOP_TABLES = ["public.customers", "public.orders", "public.order_items"]


@pytest.fixture
def shop(pg: PgServer, database: str, tmp_path: Path) -> Pipeline:
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=300)
    return make_pipeline(tmp_path, dsn, SHOP_TABLES, extra="capture:\n  file_changes: 20000\n")


def peak_rss_mib(proc: subprocess.Popen[str]) -> float:
    """The child's own high-water RSS, sampled from /proc until it exits.

    Not `wait4`'s ru_maxrss: Linux counts the forked parent's image (the test process) in it.
    """
    peak_kib = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except FileNotFoundError:
            break
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak_kib = max(peak_kib, int(line.split()[1]))
        time.sleep(0.02)
    return peak_kib / 1024


def assert_staged_equals_truth(p: Pipeline, truth_slot: str) -> list:
    truth = read_truth(p.dsn, truth_slot)
    staged = staged_changes(p.changes)
    assert len(staged) == len(truth), (
        f"staged {len(staged)} changes, the server committed {len(truth)}"
    )
    for i, (got, want) in enumerate(zip(comparable(staged), comparable(truth), strict=True)):
        assert got == want, f"change {i} differs:\n staged {got}\n truth  {want}"
    return truth


def test_a_workload_is_staged_exactly_once_in_commit_order(shop: Pipeline) -> None:
    first = shop.ingest("--capture-only")
    assert first.returncode == 0, first.stderr
    create_truth_slot(shop.dsn, f"{shop.slot}_truth")
    # `changes` counts rolled-back rows too: ask for enough that 100,000 commit
    spec = WorkloadSpec(
        changes=107_000, txn_size=(1, 40), concurrency=4, rollback_fraction=0.05, seed=11
    )
    stats = run_workload(shop.dsn, spec)
    assert stats.transactions_rolled_back > 0
    assert stats.transactions_committed >= 50

    run = shop.ingest("--capture-only")
    assert run.returncode == 0, run.stderr
    assert f"captured {stats.transactions_committed} transactions" in run.stdout
    truth = assert_staged_equals_truth(shop, f"{shop.slot}_truth")
    assert len(truth) == stats.rows_changed_committed >= 100_000
    xids = [c.xid for c in truth]
    assert len(set(xids)) == stats.transactions_committed
    assert any(a > b for a, b in itertools.pairwise(xids)), "commit order differs from start order"

    again = shop.ingest("--capture-only")
    assert again.returncode == 0, again.stderr
    assert "captured 0 transactions, 0 changes in 0 staged files" in again.stdout


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(shop: Pipeline) -> None:
    # small files and chunks: kills land while reading, writing row groups, renaming, confirming
    (shop.home / "pipelines" / "p.yaml").write_text(
        (shop.home / "pipelines" / "p.yaml")
        .read_text()
        .replace(
            "capture:\n  file_changes: 20000\n",
            "capture:\n  file_changes: 400\n  chunk_changes: 100\n",
        )
    )
    assert shop.ingest("--capture-only").returncode == 0
    create_truth_slot(shop.dsn, f"{shop.slot}_truth")
    stop = threading.Event()
    spec = WorkloadSpec(duration_s=900, rate=3000, txn_size=(1, 30), concurrency=3, seed=5)
    writer = threading.Thread(target=run_workload, args=(shop.dsn, spec), kwargs={"stop": stop})
    writer.start()
    seed = int(os.environ.get("CDC_CRASH_SEED", "20261121"))
    rng = random.Random(seed)
    kills = mid_capture = 0
    try:
        while kills < 24:
            time.sleep(rng.uniform(1.0, 3.0))  # a backlog of a few thousand changes
            before = len(staged_files(shop.changes))
            proc = shop.start_ingest("--capture-only")
            if kills % 3 == 0:  # anywhere: start-up (imports, checks, about 0.6 s) or capture
                time.sleep(rng.uniform(0.05, 1.2))
            else:  # inside capture, however long start-up takes on a loaded machine
                _wait_until_reading(shop, proc)
                time.sleep(rng.uniform(0.0, 0.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
                mid_capture += len(staged_files(shop.changes)) > before
            proc.communicate()
    finally:
        stop.set()
        writer.join()
    final = shop.ingest("--capture-only")
    assert final.returncode == 0, final.stderr
    print(f"\n{kills} SIGKILLs (seed {seed}), {mid_capture} after the run had staged files")
    assert mid_capture >= 3, "kills should land inside capture, not only at start-up"
    assert_staged_equals_truth(shop, f"{shop.slot}_truth")


def _wait_until_reading(p: Pipeline, proc: subprocess.Popen[str], timeout_s: float = 30) -> None:
    """Until the run holds its slot (it is reading the stream), or has ended."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(p.dsn, autocommit=True) as conn:
        while proc.poll() is None and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (p.slot,)
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.02)


def sql_reader_pipeline(
    dsn: str, tmp_path: Path, *, peek_changes: int, file_changes: int
) -> Pipeline:
    """The shop sample captured by the sql reader, its slot caught up, and a ground-truth slot
    (`<slot>_truth`) created after it."""
    create_schema(dsn)
    load_shop(dsn, customers=100)
    p = make_pipeline(tmp_path, dsn, SHOP_TABLES, source_extra="reader: sql\n",
                      extra=f"capture:\n  peek_changes: {peek_changes}\n"
                            f"  file_changes: {file_changes}\n")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    create_truth_slot(dsn, f"{p.slot}_truth")
    return p


def test_the_sql_reader_stages_the_same_changes(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    p = sql_reader_pipeline(pg.dsn(database), tmp_path, peek_changes=3000, file_changes=5000)
    run_workload(p.dsn, WorkloadSpec(changes=15_000, concurrency=3, seed=3))
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr
    assert_staged_equals_truth(p, f"{p.slot}_truth")
    assert len(staged_files(p.changes)) >= 3  # one file per bounded peek at least


def test_the_sql_reader_confirms_files_staged_inside_a_peek(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A peek's rows arrive as a stream on the reader's connection, and files are staged (and
    confirmed) before the peek is read to its end: the slot moves once the peek is read, and a
    run that stops inside a peek (a transaction committed after the end it saw at start) leaves
    the connection usable."""
    dsn = pg.dsn(database)
    p = sql_reader_pipeline(dsn, tmp_path, peek_changes=50_000, file_changes=1000)
    run_workload(dsn, WorkloadSpec(changes=15_000, concurrency=3, seed=3))
    run = p.ingest("--capture-only", timeout=120)  # one peek, some 15 files staged inside it
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(staged_files(p.changes)) >= 10
    done = threading.Event()

    def write() -> None:
        try:
            run_workload(dsn, WorkloadSpec(changes=15_000, concurrency=3, seed=4))
        finally:
            done.set()  # the captures below stop even if the workload fails

    writer = threading.Thread(target=write)
    writer.start()
    runs = 0
    while not done.is_set() or runs == 0:  # captures while the workload commits
        run = p.ingest("--capture-only", timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        runs += 1
    writer.join()
    run = p.ingest("--capture-only", timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_staged_equals_truth(p, f"{p.slot}_truth")
    with psycopg.connect(dsn) as conn:
        slot = slot_state(conn, p.slot)
    assert slot is not None
    assert slot.confirmed_flush >= staged_files(p.changes)[-1].end


def test_a_peek_that_read_the_whole_range_is_the_last(pg: PgServer, database: str) -> None:
    """Every peek decodes again from the slot's `restart_lsn`. The reader peeks again only when
    a peek stopped at its count before the end of the range, not to find nothing."""
    dsn = pg.dsn(database)
    options = "'proto_version', '1', 'publication_names', 'p_once'"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE once (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p_once FOR TABLE once")
        for slot in ("once_a", "once_b", "once_c"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for t in range(3):  # three transactions of 12 messages: Begin, 10 Inserts, Commit
            conn.execute("INSERT INTO once SELECT g FROM generate_series(%s::int, %s::int) g",
                         (10 * t + 1, 10 * t + 10))  # fmt: skip
        row = conn.execute(  # the last commit's end: the range ends exactly there
            "SELECT (max(lsn) - '0/0')::bigint FROM pg_logical_slot_peek_binary_changes("
            f"'once_a', NULL, NULL, {options})"
        ).fetchone()
    assert row is not None
    end = Lsn(int(row[0]))

    def read(slot: str, peek_changes: int) -> tuple[int, list[bytes]]:
        source = SqlSource(Dsn(dsn), slot, "p_once", peek_changes=peek_changes)
        source.open(Lsn(0))
        messages: list[bytes] = []
        commit = 0
        try:
            for event in source.events(end):
                if isinstance(event, list):  # (each peek sends the Relation again)
                    messages += [m for _, m in event if m[:1] != b"R"]
                    commit = max([lsn for lsn, m in event if m[:1] == b"C"], default=commit)
                elif isinstance(event, Checkpoint):
                    source.confirm(Lsn(commit))  # as capture does once the peek is staged
        finally:
            source.close()
        return source.peeks, messages

    fewer, whole = read("once_a", peek_changes=1000)  # stops short of its count: the end
    assert fewer == 1
    assert len(whole) == 36
    assert [m[:1] for m in whole].count(b"I") == 30
    assert read("once_b", peek_changes=36) == (1, whole)  # at its count, at the range's end
    assert read("once_c", peek_changes=12) == (3, whole)  # one transaction a peek


def test_a_million_row_transaction_is_staged_in_bounded_memory(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, customer_id bigint, status text, "
            "total numeric(12,2), currency char(3), placed_at timestamptz, note text)"
        )
    p = make_pipeline(tmp_path, dsn, ["public.big"])
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO big SELECT g, g % 1000, 'shipped', (g % 100000) / 100.0, 'EUR', "
            "now(), 'note ' || g FROM generate_series(1, 1000000) g"
        )
    proc = p.start_ingest("--capture-only")
    peak_mib = peak_rss_mib(proc)
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    print(f"\npeak RSS of ingest staging a 1,000,000-row transaction: {peak_mib:.0f} MiB")
    assert peak_mib < 1024
    files = staged_files(p.changes)
    assert len(files) == 1
    meta = read_metadata(p.changes / str(files[0]))
    assert (meta["changes"], meta["transactions"]) == (1_000_000, 1)


@pytest.mark.parametrize("reader", ["stream", "sql"])
def test_where_a_reader_starts_is_recorded_before_the_slot_moves_there(
    pg: PgServer, database: str, tmp_path: Path, reader: str
) -> None:
    """A run killed after publishing a staged file and before recording its end leaves that end
    ahead of `_state/stream.json`, and the next run opens its reader there. Both readers report
    their start to the slot as confirmed: the sql reader advances the slot to it, the stream
    reader's status messages carry it. Unrecorded, a kill before the run's first confirmation
    left the slot ahead of the record, and the run after took the slot for a recreated one and
    refused to go on (`make crash`, seed 20261122, on 2026-11-25)."""
    dsn = pg.dsn(database)
    slot = f"opened_{reader}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {slot} (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE {slot}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute(f"INSERT INTO {slot} VALUES (1)")
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    start = Lsn.parse(row[0])  # where a staged file ends, past the slot's confirmed position
    lake = Lake(str(tmp_path / "lake"))
    source = (
        SqlSource(Dsn(dsn), slot, slot) if reader == "sql" else StreamSource(Dsn(dsn), slot, slot)
    )
    recording = _Recording(source, lake, slot)
    try:
        recording.open(start)
    finally:
        recording.close()  # the stream reader sends its last status as it closes
    with psycopg.connect(dsn) as conn:
        for _ in range(100):  # the walsender takes the last status, then goes
            state = slot_state(conn, slot)
            assert state is not None
            if state.active_pid is None:
                break
            time.sleep(0.05)
    assert state.confirmed_flush == start  # the reader did report its start to the slot
    recorded = read_json(stream_file(lake))
    assert recorded is not None, "the slot moved with nothing recorded"
    assert Lsn.parse(recorded["confirmed"]) >= start


def test_a_roles_timeouts_do_not_end_the_products_own_sessions(pg: PgServer, database: str) -> None:
    """Timeouts a DBA sets on a role for applications: the product's sessions sit idle, and
    hold transactions idle, by design; a peek lasts as long as decoding its largest
    transaction. Each of these failed the same way on every run."""
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE timed (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION timed FOR TABLE timed")
        conn.execute("SELECT pg_create_logical_replication_slot('timed', 'pgoutput')")
        conn.execute("INSERT INTO timed SELECT generate_series(1, 200000)")  # one transaction
        conn.execute(
            f"ALTER ROLE postgres IN DATABASE {database} SET statement_timeout = '50ms';"
            f" ALTER ROLE postgres IN DATABASE {database} SET idle_session_timeout = '100ms';"
            f" ALTER ROLE postgres IN DATABASE {database} SET"
            " idle_in_transaction_session_timeout = '100ms'"
        )
    for values, replication in [(False, False), (True, False), (False, True)]:
        with connect(Dsn(dsn), values=values, replication=replication) as session:
            for setting in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
                assert session.execute(f"SHOW {setting}").fetchone() == ("0",)
            if not replication:
                with session.transaction():
                    time.sleep(0.3)  # idle in a transaction, then idle
                time.sleep(0.3)
                assert session.execute("SELECT 1").fetchone() == (1,)

    source = SqlSource(Dsn(dsn), "timed", "timed")
    source.open(Lsn(0))
    try:
        events = [e for e in source.events() if isinstance(e, list)]
    finally:
        source.close()
    inserts = sum(1 for batch in events for _, message in batch if message[:1] == b"I")
    assert inserts == 200000  # one peek, one transaction: far longer than 50 ms to decode


def test_a_peek_of_a_slot_another_process_reads_is_retried(pg: PgServer, database: str) -> None:
    """While another process streams from the slot (a second reader, a DBA's pg_recvlogical),
    the server refuses the peek with SQLSTATE 55006: that passes when the other process stops,
    so it is transient (exit 75, retried), not a failure for good."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE held (id int)", "CREATE PUBLICATION held FOR TABLE held",
        "SELECT pg_create_logical_replication_slot('held', 'pgoutput')")  # fmt: skip
    other = StreamSource(Dsn(dsn), "held", "held")
    other.open(Lsn(0))
    source = SqlSource(Dsn(dsn), "held", "held")
    source.open(Lsn(0))
    try:
        with pytest.raises(TransientError, match=r"'held' failed: another session is using it"):
            list(source.events())
        other.close()
        for _ in range(50):  # the walsender lets the slot go as it exits
            with psycopg.connect(dsn) as conn:
                state = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = 'held'"
                ).fetchone()
            if state == (False,):
                break
            time.sleep(0.1)
        assert any(isinstance(e, CaughtUp) for e in source.events())  # free again: it reads
    finally:
        other.close()
        source.close()


@pytest.mark.parametrize("reader", ["stream", "sql"])
def test_a_slot_dropped_after_start_stops_the_capture_and_is_not_recreated(
    pg: PgServer, database: str, tmp_path: Path, reader: str
) -> None:
    """Between a run's start and a capture (each snapshot group's catch-up, while the slot sits
    inactive) the slot is dropped. A slot the capture created would hold none of the changes
    in between, and the positions recorded from it would hide the gap from the next start."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"], source_extra=f"reader: {reader}\n")
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    capture(config, p.lake)
    start(config, p.lake)
    sql(dsn, "INSERT INTO items VALUES (1, 'lost')")
    sql(dsn, f"SELECT pg_drop_replication_slot('{p.slot}')")
    sql(dsn, "INSERT INTO items VALUES (2, 'after the drop')")
    recorded = read_json(stream_file(p.lake))

    with pytest.raises(TerminalError) as stopped:
        capture(config, p.lake)

    assert str(stopped.value).startswith(
        f"pipeline p: replication slot {p.slot} does not exist; the slot no longer has the "
        "stored position"
    )
    assert "Set snapshot.mode: when_needed" in str(stopped.value)  # the way out, as start says
    with psycopg.connect(dsn) as conn:
        assert slot_state(conn, p.slot) is None
    assert read_json(stream_file(p.lake)) == recorded
    assert staged_files(p.changes) == []
    with pytest.raises(TerminalError, match=f"replication slot {p.slot} does not exist"):
        start(config, p.lake)  # snapshot.mode no_data: the next run stops too


@pytest.mark.parametrize("reader", ["stream", "sql"])
def test_changes_made_while_the_publication_was_dropped_stop_the_capture_for_good(
    pg: PgServer, database: str, tmp_path: Path, reader: str
) -> None:
    """PostgreSQL 15 decodes each change with the publications as of that change: after a
    drop, every read of the slot fails on the change made while it was gone (42704, the
    walsender's ERROR ends the COPY), even once the next run has created it again. That is no
    lost connection to retry forever (exit 75), but the end of this slot: a TerminalError
    naming the publication and the way out, a new slot and a snapshot, which works."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"], source_extra=f"reader: {reader}\n",
                      extra="capture:\n  retries: 1\n  retry_backoff_s: 0.1\n")  # fmt: skip
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    sql(dsn, "INSERT INTO items VALUES (1, 'before the drop')")
    sql(dsn, f"DROP PUBLICATION pub_{p.slot}")
    sql(dsn, "INSERT INTO items VALUES (2, 'while it is gone')")
    recorded = read_json(stream_file(p.lake))

    start(config, p.lake)  # creates the publication again (publication.autocreate.mode)
    sql(dsn, "INSERT INTO items VALUES (3, 'after the re-creation')")
    with pytest.raises(TerminalError) as stopped:
        capture(config, p.lake)
    run = p.ingest("--capture-only")

    said = str(stopped.value)
    assert said.startswith(
        f"publication 'pub_{p.slot}' (source.publication) did not exist when changes still in "
        f"slot '{p.slot}' were made (the server said: publication \"pub_{p.slot}\" does not exist"
    )
    assert f"SELECT pg_drop_replication_slot('{p.slot}')" in said
    assert "snapshot.mode: when_needed" in said
    assert run.returncode == 1, run.stderr[-3000:]
    assert f"error: publication 'pub_{p.slot}' (source.publication) did not exist" in run.stderr
    assert staged_files(p.changes) == []
    assert read_json(stream_file(p.lake)) == recorded

    sql(dsn, f"SELECT pg_drop_replication_slot('{p.slot}')")  # the way out the error names
    p.edit("mode: no_data", "mode: when_needed")
    config = load_pipeline("p", "local", home=tmp_path)
    again = start(config, p.lake)
    assert again.decision.new_slot
    assert again.decision.snapshot
    sql(dsn, "INSERT INTO items VALUES (4, 'on the new slot')")
    assert capture(config, p.lake).changes == 1


def test_a_full_disk_while_staging_leaves_no_half_written_file(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """The temporary file of a failure that is not transient (ENOSPC) is dropped as a
    transient one's is: left behind, it kept the disk full, and the next run failed before its
    recovery could remove it."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    config = load_pipeline("p", "local", home=tmp_path)
    start(config, p.lake)
    sql(dsn, "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 100) g")
    recorded = read_json(stream_file(p.lake))

    def disk_full() -> None:
        assert list(p.lake.staging_tmp.iterdir()), "the file is written before it is published"
        raise OSError(errno.ENOSPC, "No space left on device")

    with (
        faults.hooked("stager.before_publish", disk_full),
        pytest.raises(OSError, match="No space left"),
    ):
        capture(config, p.lake)

    assert list(p.lake.staging_tmp.iterdir()) == []
    assert staged_files(p.changes) == []
    assert read_json(stream_file(p.lake)) == recorded


def test_a_quiet_pipeline_does_not_pin_wal(pg: PgServer, database: str, tmp_path: Path) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE watched (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE noise (id int, filler text)")
    p = make_pipeline(tmp_path, dsn, ["public.watched"])
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(20):
            conn.execute(
                "INSERT INTO noise SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g"
            )
        before = Lsn.parse(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])  # type: ignore[index]
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr
    assert "captured 0 transactions" in run.stdout
    assert p.confirmed() >= before, f"slot confirmed at {p.confirmed()}, WAL was at {before}"


def test_awkward_names_are_quoted_everywhere(pg: PgServer, database: str, tmp_path: Path) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "Sales"')
        conn.execute('CREATE TABLE "Sales"."Order Items" (id int PRIMARY KEY, "Note" text)')
        conn.execute('CREATE TABLE "a.b" (id int PRIMARY KEY)')
    p = make_pipeline(tmp_path, dsn, ['"Sales"."Order Items"', '"a.b"'])
    assert p.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('INSERT INTO "Sales"."Order Items" VALUES (1, \'x\')')
        conn.execute('INSERT INTO "a.b" VALUES (2)')
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr
    got = [(c.table, c.new) for c in staged_changes(p.changes)]
    assert got == [
        ("Sales.Order Items", (("id", "1"), ("Note", "x"))),
        ("public.a.b", (("id", "2"),)),
    ]


def test_publication_modes(pg: PgServer, database: str, tmp_path: Path) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE t2 (id int PRIMARY KEY)")
    disabled = make_pipeline(
        tmp_path / "d", dsn, ["public.t1"], source_extra="publication.autocreate.mode: disabled\n"
    )
    run = disabled.ingest("--capture-only")
    assert run.returncode == 1
    assert "does not exist and publication.autocreate.mode is disabled" in run.stderr

    filtered = make_pipeline(tmp_path / "f", dsn, ["public.t1"])
    assert filtered.ingest("--capture-only").returncode == 0
    (filtered.home / "pipelines" / "p.yaml").write_text(
        (filtered.home / "pipelines" / "p.yaml")
        .read_text()
        .replace("'public.t1'", "'public.t1', 'public.t2'")
    )
    assert filtered.ingest("--capture-only").returncode == 0
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
            (f"pub_{filtered.slot}",),
        ).fetchall()
    assert tables == [("t1",), ("t2",)]


def test_a_table_without_a_key_is_refused_before_it_breaks_the_source(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int)")
        conn.execute("INSERT INTO nokey VALUES (1)")
    p = make_pipeline(tmp_path, dsn, ["public.nokey"])
    run = p.ingest("--capture-only")
    assert run.returncode == 1
    assert "cdc doctor --pipeline p" in run.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE nokey SET a = 2")  # still works: nothing published it


USERS = (
    "CREATE TABLE users (id int PRIMARY KEY, email text NOT NULL)",
    "CREATE UNIQUE INDEX users_email ON users (email)",
)


def test_a_replica_identity_that_leaves_the_key_out_of_deletes_is_refused(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, *USERS, "ALTER TABLE users REPLICA IDENTITY USING INDEX users_email")
    p = make_pipeline(tmp_path, dsn, ["public.users"])

    run = p.ingest("--capture-only")

    assert run.returncode == 1, run.stderr[-3000:]
    assert "key column id of public.users is not in its replica identity (USING INDEX" in run.stderr
    assert "Run ALTER TABLE public.users REPLICA IDENTITY DEFAULT" in run.stderr


def test_every_start_refuses_an_identity_that_leaves_the_key_out_of_deletes(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, *USERS)
    p = make_pipeline(tmp_path, dsn, ["public.users"])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "ALTER TABLE users REPLICA IDENTITY USING INDEX users_email")  # between two batches

    with pytest.raises(TerminalError) as refused:
        start(load_pipeline("p", "local", home=tmp_path), p.lake)

    assert str(refused.value).startswith(
        "pipeline p: key column id of public.users is not in its replica identity "
        "(USING INDEX users_email (email))"
    )


def test_changes_made_under_an_identity_without_the_key_stop_capture_before_them(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    dsn = pg.dsn(database)
    sql(dsn, *USERS)
    p = make_pipeline(tmp_path, dsn, ["public.users"])
    assert p.ingest("--capture-only").returncode == 0
    sql(dsn, "INSERT INTO users VALUES (1, 'a'), (2, 'b')")
    with psycopg.connect(dsn) as conn:
        before = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
    sql(
        dsn,
        "ALTER TABLE users REPLICA IDENTITY USING INDEX users_email",
        "DELETE FROM users WHERE id = 1",  # its old key: the email alone
        "ALTER TABLE users REPLICA IDENTITY DEFAULT",  # fixed before the run: it starts
        "INSERT INTO users VALUES (3, 'c')",
    )

    run = p.ingest("--capture-only")

    assert run.returncode == 1, run.stderr[-3000:]
    assert "the stream holds changes of public.users made under a replica identity" in run.stderr
    assert "key column id of public.users is not in its replica identity" in run.stderr
    assert "take public.users out of source.tables and run once" in run.stderr
    assert [c for c in staged_changes(p.changes) if c.op == "d"] == []
    assert p.confirmed() <= before, "the slot moved past changes nothing staged"


def test_a_server_restart_mid_run_is_retried_within_the_run(tmp_path: Path) -> None:
    try:
        cluster_cm = throwaway_cluster("restart")
        cluster = cluster_cm.__enter__()
    except SetupError as e:
        unavailable(f"no PostgreSQL for the restart test: {e}")
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, note text)")
        p = make_pipeline(tmp_path, dsn, ["public.big"],
                          extra="capture:\n  file_changes: 50000\n  retry_backoff_s: 0.5\n")  # fmt: skip
        assert p.ingest("--capture-only").returncode == 0
        create_truth_slot(dsn, f"{p.slot}_truth")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(20):  # 400,000 changes: a few seconds of capture to interrupt
                conn.execute(
                    "INSERT INTO big SELECT g, 'note ' || g FROM generate_series(%s::bigint, %s::bigint) g",
                    (i * 20_000 + 1, (i + 1) * 20_000),
                )
        proc = p.start_ingest("--capture-only")
        deadline = time.monotonic() + 60
        while not staged_files(p.changes) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert staged_files(p.changes), "capture never started"
        cluster.restart(mode="immediate")  # a crash of the server: the stream is cut mid-capture
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "capture interrupted" in err
        assert "retrying" in err
        assert_staged_equals_truth(p, f"{p.slot}_truth")
        # the file the restart cut short is read again and counted once (twice before: 440000)
        assert "captured 20 transactions, 400000 changes in" in out, out
    finally:
        cluster_cm.__exit__(None, None, None)


def test_a_captured_table_missing_from_a_publication_not_ours_to_change_stops_the_run(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """With publication.autocreate.mode disabled nothing adds it back: the run stops with the
    statement that does, and the run that finds it published again snapshots it again."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY)")
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="when_needed")
    assert p.ingest("--capture-only").returncode == 0
    pub = f"pub_{p.slot}"
    p.edit(
        f"publication: {pub}\n", f"publication: {pub}\n  publication.autocreate.mode: disabled\n"
    )
    sql(dsn, f"ALTER PUBLICATION {pub} DROP TABLE items", "INSERT INTO items VALUES (1)")

    run = p.ingest("--capture-only")

    assert run.returncode == 1
    assert (
        f"publication '{pub}' does not publish public.items, so their changes are not streamed, "
        "and publication.autocreate.mode disabled adds no table to an existing publication. "
        f'Run ALTER PUBLICATION "{pub}" ADD TABLE ONLY "public"."items", then run again'
    ) in run.stderr
    assert p.ingest("--capture-only").returncode == 1  # not once only
    sql(dsn, f"ALTER PUBLICATION {pub} ADD TABLE items")
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr[-3000:]
    again = [j for j in load_jobs(p.lake) if j.origin == "new tables"]
    assert [[t.table.qualified for t in j.tables] for j in again] == [["public.items"]]


def test_a_peek_that_ends_with_a_lone_message_does_not_read_it_twice(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A peek stops, past its count, after a transaction or after a message written outside
    any transaction (`pg_logical_emit_message(false, ...)`). Such a message's LSN is the end of
    its WAL record, and the slot is confirmed there: the next peek decodes from there and does
    not send it again (a confirmation before the record's start stages it twice: checked)."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE lone (id int PRIMARY KEY)")
    p = make_pipeline(tmp_path, dsn, ["public.lone"], source_extra="reader: sql\n",
                      extra="capture:\n  peek_changes: 5\n")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    sql(
        dsn,
        "INSERT INTO lone VALUES (1)",  # Begin, Relation, Insert, Commit: four rows of a peek
        "SELECT pg_logical_emit_message(false, 'outbox', 'once')",  # the fifth: the peek ends
        "INSERT INTO lone VALUES (2)",
        "SELECT pg_logical_emit_message(false, 'outbox', 'last')",
        "INSERT INTO lone VALUES (3)",  # a commit flushes the WAL the lone message is in
    )
    run = p.ingest("--capture-only")
    assert run.returncode == 0, run.stderr[-3000:]
    ops = [
        (str(row["op"]), row["lsn"])
        for staged in staged_files(p.changes)
        for row in iter_rows(p.changes / str(staged))
    ]
    assert [op for op, _ in ops] == ["c", "m", "c", "m", "c"], ops
    assert len(staged_files(p.changes)) >= 2  # the peeks did end where the test means them to
