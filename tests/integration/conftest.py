"""A real PostgreSQL for the integration tier: `CDC_TEST_PG_DSN`, or a throwaway local cluster."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc_core.errors import SetupError
from cdc_core.pg.local import LocalPostgres, throwaway_cluster
from tests.conftest import unavailable
from tests.integration import jvm_archive, privileges


@dataclass(frozen=True)
class PgServer:
    """A server the tests may create databases, roles, slots and publications on."""

    base_dsn: str
    cluster: LocalPostgres | None = None

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        params = conninfo_to_dict(self.base_dsn)
        params["dbname"] = dbname
        if user is not None:
            params["user"] = user
            params.pop("password", None)
        return make_conninfo(**params)  # type: ignore[arg-type]

    def product_dsn(self, dbname: str) -> str:
        """What the product connects with: the least-privilege role (`privileges`), granted on
        `dbname`; its password is `${CDC_TEST_PG_PASSWORD}`, for a pipeline file."""
        return privileges.product_dsn(self.dsn(dbname))

    def execute(self, query: str | sql.Composable, dbname: str = "postgres") -> None:
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(query)  # type: ignore[arg-type]

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database with a unique name; returns its name."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str, *, wait_s: float = 30.0) -> None:
        """Drops `name` and every slot in it. A slot still held is let go first: a reader that
        has closed its connection leaves its walsender holding the slot for a moment after, and
        DROP DATABASE refuses a database with a slot even WITH (FORCE)."""
        deadline = time.monotonic() + wait_s
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            while True:
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE database = %s AND active_pid IS NOT NULL",
                    (name,),
                )
                with contextlib.suppress(psycopg.errors.ObjectInUse):  # taken again meanwhile
                    conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s AND NOT active",
                        (name,),
                    )
                left = conn.execute(
                    "SELECT string_agg(slot_name, ', ') FROM pg_replication_slots "
                    "WHERE database = %s",
                    (name,),
                ).fetchone()
                if left is None or left[0] is None:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"slots {left[0]} of database {name} still held")
                time.sleep(0.05)
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    external = os.environ.get("CDC_TEST_PG_DSN")
    if external:
        yield PgServer(external)
        return
    with own_server("it", "the integration tier") as server:
        yield server


@contextlib.contextmanager
def own_server(
    name: str, purpose: str, bindir: Path | None = None, extra: dict[str, str] | None = None
) -> Iterator[PgServer]:
    """A throwaway cluster where the product role has its password; unavailable without one.
    `bindir`: another server's binaries than the machine's (`pg_versions`); `extra`: settings
    over the tier's own."""
    try:
        with throwaway_cluster(name, bindir=bindir, extra=extra) as cluster:
            privileges.require_password(cluster)
            yield PgServer(cluster.dsn(), cluster)
    except SetupError as e:
        unavailable(f"no PostgreSQL for {purpose}: {e}")


@pytest.fixture(scope="session", autouse=True)
def product_password() -> Iterator[None]:
    """The product role's password in the environment, where pipeline files take it from."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(privileges.PASSWORD_VAR, privileges.PASSWORD)
        yield


@pytest.fixture(scope="session", autouse=True)
def class_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The JVMs of the tier's children map Spark's classes from one archive and keep to the
    JIT's first tier (`jvm_archive`), unless the caller set `SPARK_SUBMIT_OPTS` itself. The
    workers of one run (pytest-xdist) share the archive: their temporary directories have one
    parent, that run's."""
    if "SPARK_SUBMIT_OPTS" in os.environ:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    archive = jvm_archive.shared(
        (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jvm"
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in jvm_archive.environment(archive).items():
            patch.setenv(name, value)
        yield


@pytest.fixture
def database(pg: PgServer) -> Iterator[str]:
    """A fresh database for one test, dropped (with its slots) afterwards."""
    name = pg.create_database()
    yield name
    pg.drop_database(name)
