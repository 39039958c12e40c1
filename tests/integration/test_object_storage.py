"""The same `spark-submit jobs/ingest.py` on a Spark standalone cluster, with the lake on an
S3-compatible store through s3a:// (moto on 127.0.0.1): staged change files and state on the
store, bronze and silver written by the cluster's executor, every mirror equal to its source.

Capture runs twice alone first (`--capture-only`: no JVM, the driver's Python writes staged
files and state to the store), then the cluster run applies them with the initial snapshot.
Nothing may land on the local file system in place of the store.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyarrow import fs as pafs
from pyspark.sql import SparkSession

from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.launch import spark_submit
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, run_workload
from tests.integration.cluster import (
    BUCKET,
    S3Server,
    Standalone,
    cluster_environment,
    package_zip,
    s3_jars,
    s3_server,
    standalone,
    write_cluster_env,
)
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, Pipeline, make_pipeline, sql
from tests.integration.mirror import assert_mirror_equals_source

__all__ = ["s3_jars", "s3_server", "standalone"]  # fixtures, found by pytest through this module

SHOP = [TableName("public", t) for t in ("customers", "orders", "order_items")]


def capture_only(p: Pipeline, env: dict[str, str]) -> str:
    run = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", "--env", "cluster",
         "--capture-only"],
        env=env, cwd=p.home, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout


def changes(dsn: str, seed: int) -> None:
    spec = WorkloadSpec(changes=300, duration_s=120, rate=None, concurrency=2, seed=seed)
    assert run_workload(dsn, spec).rows_changed_committed > 0


@pytest.mark.usefixtures("s3_jars")  # resolved before any JVM starts: one clear error
@pytest.mark.slow
def test_ingest_on_a_standalone_cluster_into_s3_mirrors_the_source(  # noqa: PLR0917 - fixtures
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession,
    s3_server: S3Server, standalone: Standalone,
) -> None:  # fmt: skip
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=200)
    home = tmp_path / "home"
    root = f"s3a://{BUCKET}/{database}"
    p = make_pipeline(home, dsn, [t.qualified for t in SHOP], snapshot="initial", root=root,
                      snapshot_extra="chunk.size: 200\nmax.threads: 2\n")  # fmt: skip
    write_cluster_env(home)
    env = p.env() | cluster_environment(s3_server, standalone)
    prefix = f"{database}/"

    capture_only(p, env)  # slot, publication, the snapshot job planned: state on the store
    changes(dsn, seed=1)
    capture_only(p, env)  # the changes staged to the store
    staged = [k for k in s3_server.keys(prefix + "_staging/changes") if k.endswith(".parquet")]
    assert staged, s3_server.keys(prefix)
    changes(dsn, seed=2)

    submit = subprocess.run(
        [spark_submit(), "--master", standalone.master, "--driver-memory", "1g",
         "--py-files", str(package_zip(tmp_path)), str(ROOT / "jobs" / "ingest.py"),
         "--pipeline", "p", "--env", "cluster"],
        env=env, cwd=home, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr[-4000:] + standalone.executor_logs()
    assert "pipeline p:" in submit.stdout
    apps = standalone.applications()
    assert any(a.get("name", "").startswith("cdc") for a in apps), apps  # ran on the cluster

    keys = s3_server.keys(prefix)
    assert len([k for k in keys if k.startswith(f"{BUCKET}/{prefix}_staging/changes/")]) >= 2
    assert not [k for k in keys if "/_staging/tmp/" in k], keys  # every staged file published
    assert f"{BUCKET}/{prefix}_state/batches/latest.json" in keys
    assert f"{BUCKET}/{prefix}_state/run.holder.json" not in keys  # released
    assert any(k.startswith(f"{BUCKET}/{prefix}_state/snapshots/") for k in keys)
    assert f"{BUCKET}/{prefix}bronze/_delta_log/00000000000000000000.json" in keys
    for t in SHOP:
        assert any(
            k.startswith(f"{BUCKET}/{prefix}silver/public/{t.name}/_delta_log/") for k in keys
        )
    local = sorted(str(f.relative_to(home)) for f in home.rglob("*"))
    assert not [f for f in local if f.startswith(("lake", "s3a"))], local  # nothing local instead

    copy = tmp_path / "lake-copy"  # Delta tables move: their logs hold relative paths
    pafs.copy_files(f"{BUCKET}/{database}", str(copy), source_filesystem=s3_server.fs)
    for t in SHOP:
        assert assert_mirror_equals_source(spark, Lake(str(copy)), dsn, t) > 0


def job(p: Pipeline, env: dict[str, str], name: str, *args: str) -> str:
    """`python jobs/<name>.py --pipeline p --env cluster ARGS` that must succeed; its output."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / f"{name}.py"), "--pipeline", "p", "--env", "cluster",
         *args],
        env=env, cwd=p.home, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout


@pytest.mark.usefixtures("s3_jars")
@pytest.mark.slow
def test_a_mirror_made_from_the_stream_alone_and_maintained_on_s3(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession, s3_server: S3Server
) -> None:
    """Without a snapshot (no_data) the first batch finds no mirror: it makes it. `cdc validate`
    writes its Data Docs there (through Hadoop's client they failed on this S3 server, and the
    verdict with them). Then maintenance on the store: compaction, VACUUM (its count from the log on S3 too, where Delta
    logs no VACUUM by default), applied staged files. Spark local, the lake on S3."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    home = tmp_path / "home"
    p = make_pipeline(
        home, dsn, ["public.t"], snapshot="no_data", root=f"s3a://{BUCKET}/{database}",
        extra="maintenance:\n  staged_retention_hours: 0\n  vacuum_retention_hours: 0\n"
              "  vacuum_retention_check: false\n",
    )  # fmt: skip
    write_cluster_env(home)
    env = p.env() | cluster_environment(s3_server)  # no CDC_SPARK_MASTER: local[2]
    job(p, env, "ingest", "--capture-only")  # the slot
    for i in range(3):  # a file per batch, and files each MERGE replaced
        sql(dsn, f"INSERT INTO t SELECT g, 'v' FROM generate_series({i * 10 + 1}, {i * 10 + 10}) g",
            f"UPDATE t SET v = 'u{i}' WHERE id <= {i * 10}")  # fmt: skip
        assert "pipeline p:" in job(p, env, "ingest")

    validated = subprocess.run(
        [sys.executable, "-m", "cdc_core.cli", "validate", "--pipeline", "p", "--env", "cluster"],
        env=env, cwd=p.home, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    assert f"Data Docs: s3a://{BUCKET}/{database}/_state/quality/index.html" in validated.stdout
    assert f"{BUCKET}/{database}/_state/quality/index.html" in s3_server.keys(database)

    out = job(p, env, "maintain")

    lines = {x.partition(": ")[0]: x for x in out.splitlines()}
    assert "bronze: 3 files compacted into 1" in lines["bronze"], out
    for table in ("bronze", "silver public.t"):
        assert "vacuum removed" in lines[table], out
        assert "vacuum removed 0 " not in lines[table], out  # the count read from the log
    assert "staged files: 2 removed" in out, out  # all but the newest
    copy = tmp_path / "lake-copy"
    pafs.copy_files(f"{BUCKET}/{database}", str(copy), source_filesystem=s3_server.fs)
    assert assert_mirror_equals_source(spark, Lake(str(copy)), dsn, TableName("public", "t")) == 30
