"""Server faults: a cut connection, a server that stays down, a statement timeout, a database
that does not exist.

Each case states its outcome: the run retries within its budget and exits 0, or exits 75 with
one clear line (no traceback, no password), or exits 1 when retrying cannot help; the next run
resumes with nothing lost and nothing twice (staged == the server's own record of its commits, silver == source). One throwaway
cluster serves the file, since a case stops it and another sets a timeout on the product's
role; the product connects as the least-privilege role, with its password.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.stager import staged_files
from tests.integration import privileges
from tests.integration.conftest import PgServer, own_server
from tests.integration.ground_truth import comparable, create_truth_slot, read_truth, staged_changes
from tests.integration.harness import Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

ROWS = 10_000  # rows of 2 kB: past the first staged file, more than the sockets can buffer
CAPTURE = "capture:\n  file_changes: 2000\n  retry_backoff_s: 0.2\n"
ROLE = privileges.PRODUCT_ROLE


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server of this file's own: one case stops it, another sets a timeout on a role."""
    with own_server("faults", "the server-fault tests") as server:
        yield server


@pytest.fixture
def dsn(server: PgServer) -> Iterator[str]:
    """A fresh database on `server` (the superuser's DSN), dropped afterwards."""
    name = server.create_database("faults")
    yield server.dsn(name)
    if server.cluster is not None and not server.cluster.running():
        server.cluster.start()  # a case that failed half-way must not leave the server down
    server.drop_database(name)


def _with_backlog(dsn: str, tmp_path: Path, capture: str) -> Pipeline:
    """A pipeline of table big whose slot holds `ROWS` inserts (transactions of 2,000), then
    updates and deletes, with a ground-truth slot beside it (`<slot>_truth`)."""
    sql(dsn, "CREATE TABLE big (id bigint PRIMARY KEY, note text)")
    p = make_pipeline(tmp_path, dsn, ["public.big"], extra=capture)
    assert p.ingest("--capture-only").returncode == 0  # the slot, before the backlog
    create_truth_slot(dsn, f"{p.slot}_truth")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(1, ROWS + 1, 2_000):
            conn.execute(
                "INSERT INTO big SELECT g, repeat(md5(g::text), 64) "
                "FROM generate_series(%s::int, %s::int) g",
                (first, first + 1_999),
            )
        conn.execute("UPDATE big SET note = 'updated' WHERE id % 7 = 0")
        conn.execute("DELETE FROM big WHERE id % 11 = 0")
    return p


@contextlib.contextmanager
def _paused_mid_capture(p: Pipeline, proc: subprocess.Popen[str]) -> Iterator[None]:
    """Once the run has published its first change file, stop it (SIGSTOP) for the block: the
    fault lands in the middle of the backlog however fast the machine is; then let it go on."""
    deadline = time.monotonic() + 60
    while not staged_files(p.changes) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGSTOP)
    try:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the fault: {err}")
        assert staged_files(p.changes), "the run staged nothing within 60 s"
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def _assert_staged_equals_truth(p: Pipeline) -> int:
    """Every committed change staged exactly once, in commit order; returns how many."""
    truth = read_truth(p.dsn, f"{p.slot}_truth")
    staged = staged_changes(p.changes)
    assert len(staged) == len(truth), f"staged {len(staged)} changes, the server has {len(truth)}"
    for i, (got, want) in enumerate(zip(comparable(staged), comparable(truth), strict=True)):
        assert got == want, f"change {i} differs:\n staged {got}\n truth  {want}"
    return len(truth)


def _one_error_line(run: subprocess.CompletedProcess[str]) -> str:
    """A failed run says it in one `error:` line: no traceback, no password anywhere."""
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert privileges.PASSWORD not in run.stderr + run.stdout
    return lines[0]


def _finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_cut_replication_connection_is_retried_within_the_run(dsn: str, tmp_path: Path) -> None:
    p = _with_backlog(dsn, tmp_path, CAPTURE)
    proc = p.start_ingest("--capture-only")
    with _paused_mid_capture(p, proc), psycopg.connect(dsn, autocommit=True) as conn:
        cut = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE backend_type = 'walsender' AND application_name = 'cdc-lake'"
        ).fetchone()
    assert cut == (1,), "the run's walsender was not there to be cut"

    run = _finish(proc)
    assert run.returncode == 0, run.stderr[-3000:]  # one retry of the 5 the budget allows
    assert "capture interrupted" in run.stderr
    assert "retrying in 0.2 s" in run.stderr
    assert _assert_staged_equals_truth(p) > ROWS  # resumed where the durable files ended


def test_a_server_down_past_the_retry_budget_exits_75_and_the_next_run_loses_nothing(
    server: PgServer, dsn: str, tmp_path: Path, spark: SparkSession
) -> None:
    cluster = server.cluster
    assert cluster is not None
    p = _with_backlog(dsn, tmp_path, CAPTURE + "  retries: 1\n")  # one retry, 0.2 s later
    proc = p.start_ingest("--capture-only")
    with _paused_mid_capture(p, proc):
        cluster.stop("immediate")  # a crash, and the server stays down past the budget

    crashed = _finish(proc)
    assert crashed.returncode == 75, crashed.stderr[-3000:]
    line = _one_error_line(crashed)
    assert "cannot connect to PostgreSQL at user=cdc_lake" in line
    assert "password=***" in line
    assert "(gave up after 2 attempts;" in line
    assert "are safe, the next run resumes there)" in line

    down = p.ingest("--capture-only")  # a run started while it is down: refused, transient
    assert down.returncode == 75, down.stderr[-3000:]
    assert "error: cannot connect to PostgreSQL at user=cdc_lake" in _one_error_line(down)

    cluster.start()
    resumed = p.ingest("--once")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _assert_staged_equals_truth(p) > ROWS  # nothing lost, nothing twice
    rows = ROWS - ROWS // 11
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "big")) == rows


def test_with_retries_unlimited_a_run_waits_out_a_server_down_past_the_default_budget(
    server: PgServer, dsn: str, tmp_path: Path
) -> None:
    """capture.retries -1 (Debezium's errors.max.retries -1): the run keeps retrying while the
    server is down, past the 5 retries of the default, and finishes once it is back."""
    cluster = server.cluster
    assert cluster is not None
    p = _with_backlog(dsn, tmp_path, CAPTURE.replace("0.2", "0.05") + "  retries: -1\n")
    proc = p.start_ingest("--capture-only")
    with _paused_mid_capture(p, proc):
        cluster.stop("immediate")
    assert proc.stderr is not None
    retries = 0
    for line in proc.stderr:  # 0.05 s, doubling: the 7th retry comes about 6 s after the crash
        retries += "capture interrupted" in line
        if retries == 7:
            break
    assert retries == 7, "the run stopped retrying"
    cluster.start()

    run = _finish(proc)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _assert_staged_equals_truth(p) > ROWS  # nothing lost, nothing twice


def test_a_database_that_does_not_exist_exits_1_naming_it(dsn: str, tmp_path: Path) -> None:
    """Not 75 ("safe to retry"): a scheduler would retry it forever."""
    p = make_pipeline(tmp_path, dsn, ["public.items"])
    p.edit(f"dbname={conninfo_to_dict(dsn)['dbname']}", "dbname=no_such_shop")  # renamed, say

    run = p.ingest("--capture-only")

    assert run.returncode == 1, run.stderr[-3000:]
    line = _one_error_line(run)
    assert line.startswith("error: cannot connect to PostgreSQL at user=cdc_lake")
    assert "password=***" in line
    assert 'database "no_such_shop" does not exist' in line
    assert line.endswith("retrying will not help: source.dsn: correct the user or database name")


def _snapshot_reader_holds_its_lock(dsn: str) -> bool:
    """The snapshot's coordinator is inside its read: ACCESS SHARE on items, in a transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.relation = 'items'::regclass AND l.mode = 'AccessShareLock' AND l.granted "
            "AND a.application_name = 'cdc-lake' AND a.state = 'idle in transaction'"
        ).fetchone()
    return row is not None and row[0] > 0


def _exit_75_while_items_is_locked(dsn: str, p: Pipeline) -> str:
    """Run `p` while another session holds items in ACCESS EXCLUSIVE mode (a long ALTER TABLE,
    say): it must exit 75; returns its error line."""
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        held = p.ingest(child=True)  # the process's whole output, its JVM's too
        holder.rollback()
    assert held.returncode == 75, held.stderr[-3000:]
    return _one_error_line(held)


def test_a_query_past_source_query_timeout_exits_75_naming_it_and_the_next_run_resumes(
    dsn: str, tmp_path: Path, spark: SparkSession
) -> None:
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 5000) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                      source_extra="query_timeout_s: 2\n")  # fmt: skip
    database = conninfo_to_dict(dsn)["dbname"]
    # source.query_timeout_s, not the role's statement_timeout, bounds the product's queries
    sql(dsn, f"ALTER ROLE {ROLE} IN DATABASE {database} SET statement_timeout = '1h'")

    # a long ALTER TABLE (say) holds the table when the run starts: the run's first statement
    # that needs it (psycopg: the publication's set-up) waits until source.query_timeout_s
    # (statement_timeout) cancels it
    line = _exit_75_while_items_is_locked(dsn, p)
    assert "a query on the source ran past source.query_timeout_s" in line
    assert "canceling statement due to statement timeout [SQLSTATE 57014]" in line

    # the lock is asked for once the read holds its own: it queues behind the read, and Spark's
    # JDBC sessions queue behind it. They give up after 1 s, and the read gives way: the lock is
    # granted, and the read's next attempt waits for it until source.query_timeout_s cancels it
    proc = p.start_ingest()
    with psycopg.connect(dsn) as holder:
        deadline = time.monotonic() + 120
        while not _snapshot_reader_holds_its_lock(dsn) and proc.poll() is None:
            assert time.monotonic() < deadline, "the snapshot read never started"
            time.sleep(0.01)
        locking = threading.Thread(
            target=holder.execute, args=("LOCK TABLE items IN ACCESS EXCLUSIVE MODE",)
        )
        locking.start()  # granted when the run's read gives way
        locking.join(timeout=60)
        assert not locking.is_alive(), "the read did not give way to the lock queued behind it"
        reading = _finish(proc)
        holder.rollback()
    assert reading.returncode == 75, reading.stderr[-3000:]
    assert "the read gave way to it and starts again (attempt 2 of 5)" in reading.stderr
    line = _one_error_line(reading)
    assert "a query on the source ran past source.query_timeout_s" in line
    assert "canceling statement due to statement timeout [SQLSTATE 57014]" in line

    p.edit("query_timeout_s: 2", "query_timeout_s: 0")
    sql(dsn, f"ALTER ROLE {ROLE} IN DATABASE {database} RESET statement_timeout",
        "UPDATE items SET v = 'changed' WHERE id <= 100", "DELETE FROM items WHERE id > 4900")  # fmt: skip
    resumed = p.ingest()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 4900


def test_a_snapshot_read_waits_for_its_table_lock_as_long_as_snapshot_lock_timeout_ms(
    dsn: str, tmp_path: Path, spark: SparkSession
) -> None:
    """A long ALTER TABLE (say) holds the table when a planned snapshot's read asks for its
    ACCESS SHARE lock: the read waits `snapshot.lock.timeout.ms` (Debezium's name), then the
    run exits 75 naming the wait, and the next run reads the table."""
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                      snapshot_extra="lock.timeout.ms: 1500\n")  # fmt: skip
    planned = p.ingest("--capture-only")  # plans the snapshot; its reads wait for Spark
    assert planned.returncode == 0, planned.stderr[-3000:]
    line = _exit_75_while_items_is_locked(dsn, p)
    assert "snapshot of public.items: no ACCESS SHARE lock within 1500 ms" in line, line
    sql(dsn, "DELETE FROM items WHERE id > 400")
    resumed = p.ingest()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, TableName("public", "items")) == 400
