"""The commands users type, run as users run them: cdc doctor, spark-submit ingest, cdc demo."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_core.launch import spark_submit, submit_environment
from cdc_core.pg.local import free_port
from cdc_core.sample.shop import create_schema, load_shop
from tests.integration.conftest import PgServer
from tests.integration.privileges import product_conninfo

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shop(pg: PgServer, database: str) -> str:
    """A small shop database, as the demo creates it; returns the DSN the product runs with
    (the least-privilege role, its password in it: it goes in the environment)."""
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=50)
    return product_conninfo(dsn)


def run(
    args: list[str], env: dict[str, str], timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_doctor_passes_for_the_orders_pipeline_on_the_shop_database(
    shop: str, tmp_path: Path
) -> None:
    env = submit_environment({"ORDERS_PG_DSN": shop, "LAKE_ROOT": str(tmp_path)})
    proc = run([sys.executable, "-m", "cdc_core.cli", "doctor", "--pipeline", "orders"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert "wal_level" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith("0 failed")


def test_doctor_exits_2_with_the_fix_for_a_table_without_key(
    pg: PgServer, shop: str, database: str
) -> None:
    pg.execute("ALTER TABLE order_items DROP CONSTRAINT order_items_pkey", database)
    env = submit_environment({"ORDERS_PG_DSN": shop})
    proc = run([sys.executable, "-m", "cdc_core.cli", "doctor", "--pipeline", "orders"], env)
    assert proc.returncode == 2
    assert 'ALTER TABLE "public"."order_items" REPLICA IDENTITY FULL;' in proc.stdout


def test_spark_submit_ingest_runs_the_orders_pipeline(shop: str, tmp_path: Path) -> None:
    env = submit_environment({"ORDERS_PG_DSN": shop, "LAKE_ROOT": str(tmp_path)})
    proc = run([spark_submit(), "jobs/ingest.py", "--pipeline", "orders"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pipeline orders:" in proc.stdout
    assert (
        "snapshot: 650 rows read, tables done: public.customers, public.orders, public.order_items"
        in proc.stdout
    ), proc.stdout
    for table in ("customers", "orders", "order_items"):
        assert (tmp_path / "orders" / "silver" / "public" / table / "_delta_log").is_dir()


@pytest.fixture
def demo_home() -> Iterator[Path]:
    """A home for the demo's cluster that the unprivileged server user can reach."""
    home = Path(f"/var/tmp/cdc-lake-pg/test-demo-{os.getpid()}")
    yield home
    env = dict(os.environ, CDC_PG_HOME=str(home))
    run([sys.executable, "-m", "cdc_core.cli", "pg", "destroy"], env)
    shutil.rmtree(home, ignore_errors=True)


def test_the_demo_command_runs_and_says_where_everything_is(
    demo_home: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = submit_environment({"CDC_PG_HOME": str(demo_home)})
    env.pop("ORDERS_PG_DSN", None)
    lake = str(tmp_path / "lake")
    args = [
        sys.executable,
        "-m",
        "cdc_core.cli",
        "demo",
        "--port",
        str(port),
        "--changes",
        "200",
        "--lake",
        lake,
    ]
    proc = run(args, env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"PostgreSQL : postgresql://postgres@127.0.0.1:{port}/shop" in out
    assert f"(data {demo_home}/demo" in out
    assert f"lake       : {lake}/orders" in out
    assert "pipeline orders:" in out
    pg = [sys.executable, "-m", "cdc_core.cli", "pg"]
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/shop"):  # the server closes
        stop = run([*pg, "stop"], env)  # it: its end of it waits in TIME-WAIT on the port
    assert (stop.returncode, stop.stdout) == (0, "demo: stopped\n"), stop.stderr[-2000:]
    status = run([*pg, "status"], env)
    assert status.returncode == 1
    assert status.stdout.startswith("demo: stopped on ")
    again = run([*pg, "start"], env)  # the DSN the demo printed still works
    assert f"PostgreSQL running: postgresql://postgres@127.0.0.1:{port}/" in again.stdout, again
    run([*pg, "stop"], env)
    moved = run([*pg, "start", "--port", str(other := free_port())], env)
    assert f"PostgreSQL running: postgresql://postgres@127.0.0.1:{other}/" in moved.stdout, moved
    assert run([*pg, "stop"], env).returncode == 0
