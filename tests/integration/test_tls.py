"""A source that admits the product only over TLS with a client certificate (`cert` in
pg_hba.conf), its key the PEM file libpq reads: the stream (psycopg) and the snapshot's JDBC
reads (Spark's executors) both connect with the same settings from the pipeline's connection
string, verifying the server, and the mirror equals the source. (The JDBC driver before 42.7.9
read no PEM key: the snapshot failed as a lost connection, exit 75, run after run.)"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from pyspark.sql import SparkSession

from cdc_core.errors import SetupError
from cdc_core.identifiers import TableName
from cdc_core.pg.local import _os_user, throwaway_cluster
from tests.conftest import unavailable
from tests.integration import privileges
from tests.integration.harness import make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source


@dataclass(frozen=True)
class Tls:
    admin_dsn: str  # the superuser's, over TCP without TLS (trust), for the tests' own work
    port: int
    ca: Path
    cert: Path
    key: Path  # PEM, PKCS #8 (`openssl req -nodes`)


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(where: Path, client: str) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate whose CN is the role."""
    where.mkdir(parents=True)
    _openssl(where, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=cdc-test-ca")  # fmt: skip
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", f"/CN={client}")):
        _openssl(where, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subject)  # fmt: skip
        extra = ["-extfile", "san.cnf"] if name == "server" else []
        (where / "san.cnf").write_text("subjectAltName = IP:127.0.0.1\n")
        _openssl(where, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra)  # fmt: skip
    for key in where.glob("*.key"):
        key.chmod(0o600)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    try:
        with throwaway_cluster("tls") as cluster:
            certs = cluster.data_dir / "certs"  # the server reads its own files as its OS user
            _certificates(certs, privileges.PRODUCT_ROLE)
            user = _os_user()
            if user is not None:
                for path in [certs, *certs.iterdir()]:
                    os.chown(path, user.pw_uid, user.pw_gid)
            client = tmp_path_factory.mktemp("client")  # the product's copies, owned by us
            for name in ("ca.crt", "client.crt", "client.key"):
                (client / name).write_bytes((certs / name).read_bytes())
                (client / name).chmod(0o600)
            hba = cluster.data_dir / "pg_hba.conf"
            only_tls = [f"hostnossl {db} {privileges.PRODUCT_ROLE} 0.0.0.0/0 reject"
                        for db in ("all", "replication")]  # fmt: skip
            by_cert = [f"hostssl {db} {privileges.PRODUCT_ROLE} 127.0.0.1/32 cert"
                       for db in ("all", "replication")]  # fmt: skip
            hba.write_text("\n".join([*only_tls, *by_cert]) + "\n" + hba.read_text())
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                for setting, value in (("ssl", "on"), ("ssl_cert_file", certs / "server.crt"),
                                       ("ssl_key_file", certs / "server.key"),
                                       ("ssl_ca_file", certs / "ca.crt")):  # fmt: skip
                    conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
            cluster.restart()
            privileges.ensure_roles(cluster.dsn())
            yield Tls(cluster.dsn(), cluster.port, client / "ca.crt", client / "client.crt",
                      client / "client.key")  # fmt: skip
    except FileNotFoundError as e:
        unavailable(f"no openssl for the TLS test's certificates (apt-get install openssl): {e}")
    except (SetupError, subprocess.CalledProcessError) as e:
        unavailable(f"no PostgreSQL with TLS for the TLS test: {e}")


@pytest.mark.slow
def test_the_stream_and_the_snapshot_reads_connect_with_a_client_certificate_and_its_pem_key(
    tls: Tls, tmp_path: Path, spark: SparkSession
) -> None:
    with psycopg.connect(tls.admin_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE shop")
    admin = make_conninfo(tls.admin_dsn, dbname="shop")
    items = TableName("public", "items")
    sql(admin, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 500) g")  # fmt: skip
    p = make_pipeline(tmp_path, admin, ["public.items"], snapshot="initial", snapshot_extra="")
    conninfo = (
        f"postgresql://{privileges.PRODUCT_ROLE}@127.0.0.1:{tls.port}/shop?"
        f"sslmode=verify-full&sslrootcert={tls.ca}&sslcert={tls.cert}&sslkey={tls.key}"
    )
    pipeline_file = p.home / "pipelines" / "p.yaml"
    lines = pipeline_file.read_text().splitlines()
    dsn_line = next(i for i, line in enumerate(lines) if line.strip().startswith("dsn:"))
    lines[dsn_line] = f"  dsn: {conninfo}"
    pipeline_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(psycopg.OperationalError, match=r"rejects connection|no encryption"):
        psycopg.connect(make_conninfo(admin, user=privileges.PRODUCT_ROLE, sslmode="disable"))

    first = p.ingest()
    assert first.returncode == 0, first.stderr[-3000:]
    sql(admin, "UPDATE items SET v = 'streamed' WHERE id <= 10", "DELETE FROM items WHERE id > 490")
    second = p.ingest()
    assert second.returncode == 0, second.stderr[-3000:]
    assert assert_mirror_equals_source(spark, p.lake, admin, items) == 490
