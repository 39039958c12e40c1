"""`source.database.initial.statements` against a real server: run on every session that queries
the source (psycopg's and the snapshot's JDBC reads), never on one that reads the slot, with
the product's own settings made again after them; a statement that fails is named."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_core.config import Dsn, load_pipeline
from cdc_core.errors import TerminalError
from cdc_core.identifiers import TableName
from cdc_core.metrics import Totals
from cdc_core.pg.connect import connect
from cdc_core.pipeline import batch
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline, sql

TAGGED = ("SET cdc_test.tag = 'a;b'", "SET DateStyle = 'SQL, DMY'", "SET statement_timeout = '2s'")


def settings(dsn: Dsn, **kwargs: bool) -> tuple[object, ...]:
    with connect(dsn, **kwargs) as conn:
        row = conn.execute(
            "SELECT current_setting('cdc_test.tag', true), current_setting('DateStyle'), "
            "current_setting('statement_timeout'), current_setting('work_mem')"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_session_runs_them_then_makes_the_products_settings_again(
    pg: PgServer, database: str
) -> None:
    dsn = Dsn(
        pg.dsn(database), query_timeout_s=600, initial_statements=(*TAGGED, "SET work_mem = '7MB'")
    )
    # DateStyle is the user's where values are not read; the timeout always the product's
    assert settings(dsn) == ("a;b", "SQL, DMY", "10min", "7MB")
    assert settings(dsn, values=True) == ("a;b", "ISO, DMY", "10min", "7MB")
    assert settings(dsn, autocommit=False) == ("a;b", "SQL, DMY", "10min", "7MB")  # committed
    assert settings(dsn, reads_slot=True, bounded=False)[:3] == (None, "ISO, MDY", "0")
    failing = Dsn(pg.dsn(database), initial_statements=("SET work_mem = '7MB'", "SELEC 1"))
    with pytest.raises(TerminalError, match=r"source\.database\.initial\.statements: statement 2 "
                                            r"\('SELEC 1'\) failed: syntax error"):  # fmt: skip
        connect(failing)


def test_snapshot_reads_run_them_on_every_jdbc_session(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The snapshot's SELECT reads a setting only the statements make, in every chunk; dates
    come out right although a statement set another DateStyle (made again after them)."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, tag text, d date)",
        "INSERT INTO t SELECT g, 'none', date '2024-12-31' - g FROM generate_series(1, 60) g")  # fmt: skip
    p = make_pipeline(
        tmp_path, dsn, ["public.t"], snapshot="initial",
        source_extra="database.initial.statements: \"SET cdc_test.tag = 'from;;initial'; "
                     "SET DateStyle = 'SQL, DMY'\"\n",
        snapshot_extra="chunk.size: 20\nselect.statement.overrides:\n  public.t: SELECT id, "
                       "current_setting('cdc_test.tag') AS tag, d FROM public.t\n",
    )  # fmt: skip
    batch(spark, load_pipeline("p", "local", home=p.home), p.lake, Totals())
    rows = spark.read.format("delta").load(p.lake.silver(TableName("public", "t"))).collect()
    assert sorted((r["id"], r["tag"], r["d"]) for r in rows) == [
        (g, "from;initial", datetime.date(2024, 12, 31) - datetime.timedelta(days=g))
        for g in range(1, 61)
    ]


def test_the_doctor_names_a_statement_that_fails_and_where_to_correct_it(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    from cdc_core.pg.doctor import run_doctor

    sql(pg.dsn(database), "CREATE TABLE t (id int PRIMARY KEY)")
    make_pipeline(tmp_path, pg.dsn(database), ["public.t"],
                  source_extra="database.initial.statements: SET nope = 1; SELEC 1\n")  # fmt: skip
    report = run_doctor(load_pipeline("p", "local", home=tmp_path))
    connected = report.checks[0]
    assert (connected.name, connected.status) == ("connect", "fail")
    assert connected.detail == (
        "source.database.initial.statements: statement 1 ('SET nope = 1') failed: "
        'unrecognized configuration parameter "nope"'
    )
    assert connected.fix.endswith("p.yaml: source.database.initial.statements: correct it")
