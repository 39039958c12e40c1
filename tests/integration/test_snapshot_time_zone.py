"""A snapshot reads values as the stream sends them, whatever time zone the JVM runs in.

The JDBC driver sends the JVM's time zone when it connects, after the `options` that set UTC,
and the server applies it last: on a machine set to Europe/Berlin, snapshot rows printed `+02`
where streamed ones print `+00`. Typed timestamps did not mind; a `tstzrange`, kept as text, did.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline
from tests.integration.mirror import assert_mirror_equals_source

KEYED, KEYLESS = TableName("public", "slots"), TableName("public", "visits")


@pytest.mark.slow
def test_snapshot_rows_print_times_in_utc_on_a_jvm_elsewhere(
    pg: PgServer, database: str, spark: SparkSession, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    dsn = pg.dsn(database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE slots (id int PRIMARY KEY, during tstzrange, at timestamptz)")
        conn.execute("CREATE TABLE visits (during tstzrange, note text)")
        conn.execute("ALTER TABLE visits REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO slots VALUES (1, '[2021-06-05 07:00+00,2021-06-05 09:00+00)', "
                     "'2021-06-05 07:23:45+00'), (2, NULL, NULL)")  # fmt: skip
        conn.execute("INSERT INTO visits VALUES ('[2021-01-01 10:00+00,2021-01-01 11:00+00)', "
                     "'twice'), ('[2021-01-01 10:00+00,2021-01-01 11:00+00)', 'twice')")  # fmt: skip
    p = make_pipeline(
        tmp_path / "tz", dsn, [KEYED.qualified, KEYLESS.qualified], snapshot="initial"
    )
    monkeypatch.setenv("TZ", "Europe/Berlin")  # the JVM's default time zone, and Python's
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    silver = spark.read.format("delta").load(p.lake.silver(KEYED)).where("id = 1").first()
    assert silver is not None
    assert silver["during"] == '["2021-06-05 07:00:00+00","2021-06-05 09:00:00+00")'
    assert assert_mirror_equals_source(spark, p.lake, dsn, KEYED) == 2
    assert assert_mirror_equals_source(spark, p.lake, dsn, KEYLESS) == 2
    with psycopg.connect(dsn, autocommit=True) as conn:  # a streamed change cancels a read row
        conn.execute("DELETE FROM visits WHERE ctid = (SELECT min(ctid) FROM visits)")
        conn.execute("UPDATE slots SET at = at + interval '1 hour' WHERE id = 1")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, dsn, KEYED) == 2
    assert assert_mirror_equals_source(spark, p.lake, dsn, KEYLESS) == 1
