"""The snapshot's Spark JDBC reads go to the server the product's own connections reach: what
libpq resolved (PGHOST, PGPORT, PGUSER, a service file), not only what the connection string
says, whose gaps the JDBC driver would fill with localhost:5432."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import SparkSession

from cdc_core.config import Dsn
from cdc_core.pg.connect import connect
from cdc_core.snapshot_read import jdbc_target
from tests.integration.conftest import PgServer
from tests.integration.harness import sql


def test_the_snapshot_reads_the_server_libpq_reached_not_jdbcs_defaults(
    pg: PgServer, database: str, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = pg.dsn(database)
    params = conninfo_to_dict(dsn)
    sql(dsn, "CREATE TABLE here (id int)", "INSERT INTO here VALUES (7)")
    for var, key in (("PGHOST", "host"), ("PGPORT", "port"), ("PGUSER", "user")):
        monkeypatch.setenv(var, str(params[key]))
    bare = Dsn(f"dbname={database}")  # host, port and user from the environment
    assert jdbc_target(bare)[0] == f"jdbc:postgresql://localhost:5432/{database}"
    with connect(bare) as conn:
        url, props = jdbc_target(bare, conn.info)
    assert url == f"jdbc:postgresql://{params['host']}:{params['port']}/{database}"
    assert props["user"] == params["user"]
    rows = spark.read.jdbc(url, "here", properties=props).collect()
    assert [r["id"] for r in rows] == [7]
