"""Transactions left open on the source: prepared transactions (two-phase commit) and sessions
idle in a transaction.

A prepared transaction's changes reach the stream at its COMMIT PREPARED, and never after a
ROLLBACK PREPARED, however many runs confirm the slot in between. A new slot waits for every
transaction that had written when it was created, in every database of the server, and the run
names them while it waits. `replica.identity.autoset.values` gives up a lock the table's readers
and writers would queue behind. Prepared transactions need `max_prepared_transactions`, which
the tier's shared server leaves at 0: the module starts a server of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_core.lsn import Lsn
from tests.integration.conftest import PgServer, own_server
from tests.integration.ground_truth import create_truth_slot, read_truth
from tests.integration.harness import ROOT, make_pipeline, sql
from tests.integration.test_capture import assert_staged_equals_truth


@pytest.fixture(scope="module")
def two_phase() -> Iterator[PgServer]:
    extra = {"max_prepared_transactions": "4"}
    with own_server("tp", "prepared transactions", extra=extra) as server:
        yield server


@pytest.fixture
def db(two_phase: PgServer) -> Iterator[str]:
    """A fresh database; prepared transactions left in it are rolled back before it is dropped
    (they would keep it, and hold up every later slot of the server)."""
    name = two_phase.create_database()
    yield name
    with psycopg.connect(two_phase.dsn(name), autocommit=True) as conn:
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s",
                                   (name,)).fetchall():  # fmt: skip
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    two_phase.drop_database(name)


def prepare(dsn: str, gid: str, *statements: str) -> None:
    """Run `statements` in one transaction and PREPARE it as `gid`, its session then closed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
        conn.execute(f"PREPARE TRANSACTION '{gid}'")  # type: ignore[arg-type]


@pytest.mark.parametrize("reader", ["stream", "sql"])
def test_a_prepared_transaction_is_captured_at_commit_prepared_and_never_after_rollback(
    two_phase: PgServer, db: str, tmp_path: Path, reader: str
) -> None:
    dsn = two_phase.dsn(db)
    sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)",
        "INSERT INTO accounts SELECT g, 100 FROM generate_series(1, 10) g")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.accounts"],
                      source_extra="reader: sql\n" if reader == "sql" else "")  # fmt: skip
    assert p.ingest("--capture-only").returncode == 0
    create_truth_slot(dsn, f"{p.slot}_truth")
    prepare(dsn, "transfer", "UPDATE accounts SET balance = balance - 30 WHERE id = 1",
            "UPDATE accounts SET balance = balance + 30 WHERE id = 2",
            "INSERT INTO accounts VALUES (11, 0)")  # fmt: skip
    prepare(dsn, "doomed", "DELETE FROM accounts WHERE id = 3",
            "INSERT INTO accounts VALUES (12, 5)")  # fmt: skip
    with psycopg.connect(dsn) as conn:
        prepared_at = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
    sql(dsn, "INSERT INTO accounts VALUES (13, 1)")

    run = p.ingest("--capture-only", timeout=300)  # the prepared two are not committed yet
    assert run.returncode == 0, run.stderr[-3000:]
    assert "captured 1 transactions, 1 changes" in run.stdout
    assert p.confirmed() > prepared_at  # the slot moved past both PREPAREs

    sql(dsn, "COMMIT PREPARED 'transfer'", "ROLLBACK PREPARED 'doomed'",
        "UPDATE accounts SET balance = 0 WHERE id = 11")  # fmt: skip
    run = p.ingest("--capture-only", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "captured 2 transactions, 4 changes" in run.stdout
    truth = assert_staged_equals_truth(p, f"{p.slot}_truth")
    assert [(c.table, c.op) for c in truth] == [("public.accounts", op) for op in "cuucu"]
    assert not read_truth(dsn, f"{p.slot}_truth"), "the truth slot was read to its end"


def test_a_new_slot_waits_for_the_transactions_open_before_it_and_the_run_names_them(
    two_phase: PgServer, db: str, tmp_path: Path
) -> None:
    """A prepared transaction in the pipeline's database and a session idle in a transaction in
    another database, both open before the first run: `cdc doctor` names the prepared one (the
    session is younger than its minute), the run names both while its slot waits, as the
    least-privilege role (which sees neither session's start), and goes on once they end."""
    dsn = two_phase.dsn(db)
    other = two_phase.create_database()
    sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
    p = make_pipeline(tmp_path, dsn, ["public.accounts"])  # its grants lock the table: first
    prepare(dsn, "forgotten", "INSERT INTO accounts VALUES (1, 100)")
    idle = psycopg.connect(two_phase.dsn(other), autocommit=True, application_name="nightly report")
    proc: subprocess.Popen[str] | None = None
    try:
        idle.execute("BEGIN")
        idle.execute("CREATE TABLE scratch (a int)")  # it has written: it has a transaction id

        doctor = p.cdc("doctor", "--pipeline", "p")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        slot_line = next(line for line in doctor.stdout.splitlines() if line[6:11] == "slot ")
        assert slot_line.startswith("WARN"), doctor.stdout
        assert "prepared transaction 'forgotten' (user postgres, database " in slot_line
        assert f"fix: prepared transaction 'forgotten' (user postgres, database {db}, " in (
            doctor.stdout
        )
        assert f"COMMIT PREPARED 'forgotten' or ROLLBACK PREPARED 'forgotten' in database {db}" in (
            doctor.stdout
        )
        assert "nightly report" not in doctor.stdout

        errors = tmp_path / "ingest.stderr"
        with errors.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p",
                 "--capture-only"],
                env=p.env(), cwd=p.home, stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
        waiting = _logged(errors, "creating replication slot", within_s=90)
        assert proc.poll() is None, "the run ended while the transactions were open"
        assert "It waits for: " in waiting
        assert (
            f"pid {idle.info.backend_pid} (user postgres, database {other}, application "
            f"'nightly report'): commit or roll back its transaction, or end its session: "
            f"SELECT pg_terminate_backend({idle.info.backend_pid})"
        ) in waiting
        assert (
            f"prepared transaction 'forgotten' (user postgres, database {db}, prepared "
        ) in waiting
        assert "The run goes on by itself once they end" in waiting

        idle.execute("ROLLBACK")
        sql(dsn, "COMMIT PREPARED 'forgotten'")
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, errors.read_text()[-3000:]
        assert "captured 0 transactions" in out  # the prepared one committed before the slot
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        idle.close()
        two_phase.drop_database(other)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                           (p.slot,)).fetchone()  # fmt: skip
    assert row == (1,)


def _logged(path: Path, start: str, within_s: float) -> str:
    """The message of the first JSON log line in `path` that starts with `start`, waited for."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            try:
                message = str(json.loads(line).get("message", ""))
            except json.JSONDecodeError:
                continue
            if message.startswith(start):
                return message
        time.sleep(0.5)
    pytest.fail(f"no log line starting {start!r} within {within_s} s:\n{path.read_text()[-3000:]}")


def test_replica_identity_autoset_gives_up_a_lock_the_table_would_queue_behind(
    two_phase: PgServer, db: str, tmp_path: Path
) -> None:
    """`ALTER TABLE ... REPLICA IDENTITY` needs the table to itself, and while it waits every
    later statement on the table waits behind it: a run whose ALTER waits on a reader's
    transaction gives up after a few seconds (exit 75, transient) naming the reader, writes to
    the table go on meanwhile, and the next run sets the identity."""
    dsn = two_phase.dsn(db)
    sql(dsn, "CREATE TABLE events (id int, note text)")
    p = make_pipeline(tmp_path, dsn, ["public.events"],
                      source_extra="replica.identity.autoset.values: public\\.events:FULL\n")  # fmt: skip
    with psycopg.connect(dsn, autocommit=True, application_name="long report") as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events")  # holds ACCESS SHARE until it ends
        run = p.ingest("--capture-only", timeout=300)
        assert run.returncode == 75, run.stdout + run.stderr[-3000:]
        assert "Traceback" not in run.stderr
        assert (
            'replica.identity.autoset.values: ALTER TABLE "public"."events" REPLICA IDENTITY '
            "FULL waited 5 s for a lock on public.events and gave up"
        ) in run.stderr
        assert (
            f"Locks on the table are held by: pid {reader.info.backend_pid} (user postgres, "
            f"database {db}, application 'long report'): commit or roll back its transaction, "
            f"or end its session: SELECT pg_terminate_backend({reader.info.backend_pid})"
        ) in run.stderr
        sql(dsn, "INSERT INTO events VALUES (1, 'written while the run waited')")  # not queued
        reader.execute("COMMIT")
    run = p.ingest("--capture-only", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with psycopg.connect(dsn) as conn:
        ident = conn.execute("SELECT relreplident FROM pg_class WHERE oid = 'events'::regclass")
        assert ident.fetchone() == ("f",)  # type: ignore[comparison-overlap]


def test_wal_a_prepared_transaction_keeps_is_blamed_on_it_not_on_the_pipeline(
    two_phase: PgServer, db: str, tmp_path: Path
) -> None:
    """A prepared transaction nobody ends keeps the slot's restart position before its first
    change, however often the pipeline runs: past source.retained_wal_warn, `cdc status` names
    it and the statements that end it, instead of telling to run the pipeline more often."""
    dsn = two_phase.dsn(db)
    sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)",
        "CREATE TABLE noise (id int, filler text)")  # fmt: skip
    p = make_pipeline(tmp_path, dsn, ["public.accounts"], source_extra="retained_wal_warn: 8MB\n")
    assert p.ingest("--capture-only").returncode == 0
    prepare(dsn, "stuck", "INSERT INTO accounts VALUES (1, 100)")
    for _ in range(4):  # some 40 MB of WAL the pipeline does not capture
        sql(dsn, "INSERT INTO noise SELECT g, repeat('x', 200) FROM generate_series(1, 40000) g")
    run = p.ingest("--capture-only", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "captured 0 transactions" in run.stdout

    status = json.loads(p.cdc("status", "--pipeline", "p", "--json").stdout)
    slot = status["slot"]
    assert slot["retained_wal_bytes"] > 30_000_000
    assert slot["held_by"] == (
        f"prepared transaction 'stuck' (user postgres, database {db}, prepared "
        f"{slot['held_by'].split(' prepared ')[1].split(' ago')[0]} ago): COMMIT PREPARED "
        f"'stuck' or ROLLBACK PREPARED 'stuck' in database {db}"
    )
    [warning] = [w for w in status["warnings"] if "retained_wal_warn" in w]
    assert (
        "the pipeline confirmed it, but decoding must restart before the oldest transaction open "
        "in the slot's database, which no run ends: prepared transaction 'stuck'"
    ) in warning
    assert "run it more often" not in warning

    sql(dsn, "COMMIT PREPARED 'stuck'")
    assert p.ingest("--capture-only", timeout=300).returncode == 0
    status = json.loads(p.cdc("status", "--pipeline", "p", "--json").stdout)
    assert status["slot"]["held_by"] is None  # the restart position moves on at later runs
    for warning in [w for w in status["warnings"] if "retained_wal_warn" in w]:
        assert warning.endswith("the pipeline is behind the source; run it more often")


def test_a_run_stopped_while_its_slot_waits_leaves_no_position_for_the_next_runs_to_misread(
    two_phase: PgServer, db: str, tmp_path: Path
) -> None:
    """A run killed while its slot's creation waits (a scheduler's timeout, say) leaves its
    session creating the slot on the server, with no position yet. A run meanwhile exits 75
    naming what the slot waits for, and records nothing; once the transaction ends, that session
    finishes the slot, and the next run reads on from it. Before, the run meanwhile recorded the
    missing position as 0/0, and every later one stopped as if changes had been lost."""
    dsn = two_phase.dsn(db)
    sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
    p = make_pipeline(tmp_path, dsn, ["public.accounts"])
    prepare(dsn, "stuck", "INSERT INTO accounts VALUES (1, 100)")
    errors = tmp_path / "first.stderr"
    with errors.open("w") as err:
        first = subprocess.Popen(
            [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", "--capture-only"],
            env=p.env(), cwd=p.home, stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
    try:
        _logged(errors, "creating replication slot", within_s=90)
    finally:
        first.kill()
        first.wait()

    meanwhile = p.ingest("--capture-only", timeout=300)
    assert meanwhile.returncode == 75, meanwhile.stdout + meanwhile.stderr[-3000:]
    assert f"replication slot '{p.slot}' is still being created by session " in meanwhile.stderr
    assert "It waits for: prepared transaction 'stuck' (user postgres, database " in (
        meanwhile.stderr
    )

    sql(dsn, "ROLLBACK PREPARED 'stuck'")
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                           (p.slot,)).fetchone() != (False,):  # fmt: skip
            assert time.monotonic() < deadline, "the killed run's session never made the slot"
            time.sleep(0.2)
    sql(dsn, "INSERT INTO accounts VALUES (2, 50)")
    run = p.ingest("--capture-only", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "captured 1 transactions, 1 changes" in run.stdout
