"""jobs/maintain.py beside `ingest --continuous`, under a workload: "safe while ingest runs".

Maintenance compacts the mirror and bronze, deletes bronze rows silver has merged and removes
staged files bronze holds, while batches append and MERGE. A commit that loses to the other
side's is retried (ingest) or left for the next run (maintenance, exit 75); either way the
mirror ends equal to its source. The workload changes keys of rows with an out-of-line value
and updates them after, so batches carry values only the rows before them know.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import psycopg
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import ingest_ok, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

EVENTS = TableName("public", "events")


def _workload(dsn: str, stop: threading.Event, written: list[int]) -> None:
    """Small transactions until `stop`: inserts (a fifth with an out-of-line `big`), updates of
    `v` alone, key changes (`id` to `-id`), deletes."""
    rng = random.Random(11)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                conn.execute("INSERT INTO events (v, big) SELECT md5(random()::text), "
                             "CASE WHEN random() < 0.2 THEN repeat(md5(random()::text), 400) END "
                             "FROM generate_series(1, %s)", (rng.randint(1, 20),))  # fmt: skip
                conn.execute("UPDATE events SET v = 'u' || v WHERE id %% 17 = %s",
                             (rng.randint(0, 16),))  # fmt: skip
                conn.execute("UPDATE events SET id = -id WHERE id > 0 AND id %% 97 = %s",
                             (rng.randint(0, 96),))  # fmt: skip
                conn.execute("DELETE FROM events WHERE id %% 31 = %s", (rng.randint(0, 30),))
            written[0] += 1
            time.sleep(0.02)


def test_maintenance_beside_a_continuous_ingest_leaves_the_mirror_equal_to_its_source(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE events (id bigserial PRIMARY KEY, v text, big text)",
        "ALTER TABLE events ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO events (v, big) SELECT 'seed', repeat('x', 5000) FROM generate_series(1, 500)",
    )
    p = make_pipeline(tmp_path, dsn, [EVENTS.qualified], snapshot="initial",
                      extra="capture:\n  trigger_interval_s: 1\n"
                            "maintenance:\n  staged_retention_hours: 0\n"
                            "  bronze_retention_days: 0\n")  # fmt: skip
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_workload, args=(dsn, stop, written), daemon=True)
    writer.start()
    run = p.start_ingest("--continuous")
    runs = []
    try:
        deadline = time.monotonic() + 600
        while p.batches() < 2 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(1)
        assert p.batches() >= 2, "fewer than 2 batches in 10 minutes"
        for _ in range(3):
            runs.append(p.maintain())
            assert run.poll() is None, run.communicate()[1][-5000:]
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
        stop.set()
        writer.join()
    assert run.returncode == 0, err[-5000:]
    assert written[0] > 0
    for m in runs:  # 75: a table's commit lost to ingest's, left for the next run
        assert m.returncode in (0, 75), m.stderr[-3000:]
        assert m.returncode == 0 or "stopped by a concurrent commit" in m.stdout, m.stdout
    assert any("rows past the retention deleted" in m.stdout for m in runs)
    assert any("silver public.events: " in m.stdout and "compacted into 1" in m.stdout
               for m in runs), [m.stdout for m in runs]  # fmt: skip
    ingest_ok(p)  # what the workload wrote after the stop
    assert assert_mirror_equals_source(spark, p.lake, dsn, EVENTS) > 0
