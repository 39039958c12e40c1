"""A Spark standalone cluster and an S3-compatible store (moto), both on 127.0.0.1, for tests
that run ingest the way it runs on a cluster with its lake on s3a://.

Fixtures (module-scoped: each holds JVMs or a server that later modules do not need):
* `s3_server`: `python -m moto.server` as a child process, with the bucket `lake`;
* `standalone`: a master and one worker from the pip package's `spark-class` (the package has
  no start-master.sh), worker `--cores 2 --memory 3g`, daemons at 512m heap;
* `s3_jars` (session): the jars with Hadoop's s3a connector resolved once before anything starts,
  so that a Maven failure reads as one error (the AWS SDK bundle alone is 612 MiB).

`write_cluster_env` writes `conf/cluster.yaml` into a pipeline home; its secrets and addresses
are `${VAR}`s, filled from `cluster_environment(...)` in the child's environment.

Use them from a test module with `from tests.integration.cluster import s3_server, ...`
(pytest finds fixtures imported into the module).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdc_core import jars
from cdc_core.errors import SetupError
from cdc_core.launch import submit_environment
from cdc_core.pg.local import free_port
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "lake"
REGION = "us-east-1"
ACCESS_KEY = SECRET_KEY = "testing"  # moto accepts any; the env file only names the variables
S3A_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"


@dataclass(frozen=True)
class S3Server:
    """A moto server with the bucket `lake`; `fs` reaches it from this process."""

    endpoint: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    region: str
    bucket: str
    fs: Any  # pyarrow.fs.S3FileSystem
    log: Path

    def env(self) -> dict[str, str]:
        """What `conf/cluster.yaml` takes from the environment, and what keeps the AWS SDKs
        from probing the EC2 metadata service for a region or credentials."""
        return {
            "CDC_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under `bucket/prefix` (directory markers left out), sorted."""
        from pyarrow import fs as pafs

        base = f"{self.bucket}/{prefix}".rstrip("/")
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File)


@dataclass(frozen=True)
class Standalone:
    """A running standalone master with one registered worker."""

    master: str  # spark://127.0.0.1:PORT
    web_ui: str  # the master's, http://127.0.0.1:PORT (its /json/ lists workers and apps)
    work_dir: Path  # the worker's: app-*/<executor>/stderr are the executors' logs
    logs: tuple[Path, ...]  # the master's and the worker's own

    def env(self) -> dict[str, str]:
        return {"CDC_SPARK_MASTER": self.master}

    def executor_logs(self, tail: int = 4000) -> str:
        """The end of every executor's stderr, for a failing test's message."""
        parts = [
            f"--- {p.relative_to(self.work_dir)}\n{p.read_text(errors='replace')[-tail:]}"
            for p in sorted(self.work_dir.glob("app-*/*/stderr"))
        ]
        return "\n".join(parts) or "(no executor logs)"

    def applications(self) -> list[dict[str, Any]]:
        """The master's view of running and completed applications."""
        state = _get_json(f"{self.web_ui}/json/")
        return [*state.get("activeapps", []), *state.get("completedapps", [])]


def cluster_environment(s3: S3Server, cluster: Standalone | None = None) -> dict[str, str]:
    """The variables `conf/cluster.yaml` refers to, for a child's environment."""
    return {**s3.env(), **(cluster.env() if cluster else {})}


def write_cluster_env(home: Path, name: str = "cluster") -> Path:
    """`home/conf/<name>.yaml`: Spark on the standalone master in ${CDC_SPARK_MASTER} (plain
    `python jobs/ingest.py`; spark-submit's --master wins) and s3a:// on the store at
    ${CDC_S3_ENDPOINT}. No secret is written: the keys are ${AWS_ACCESS_KEY_ID} and
    ${AWS_SECRET_ACCESS_KEY}. hadoop-aws is not listed: cdc_core.spark adds the version that
    matches Spark's Hadoop because the file sets spark.hadoop.fs.s3a.*."""
    path = home / "conf" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        textwrap.dedent(f"""\
        # A Spark standalone cluster with the lake on an S3-compatible store (tests: moto).
        spark:
          master: ${{CDC_SPARK_MASTER:-local[2]}}
          jars: resolve
          conf:
            spark.hadoop.fs.s3a.endpoint: ${{CDC_S3_ENDPOINT}}
            spark.hadoop.fs.s3a.endpoint.region: {REGION}
            spark.hadoop.fs.s3a.path.style.access: "true"
            spark.hadoop.fs.s3a.connection.ssl.enabled: "false"
            spark.hadoop.fs.s3a.aws.credentials.provider: {S3A_CREDENTIALS}
            spark.hadoop.fs.s3a.access.key: ${{AWS_ACCESS_KEY_ID}}
            spark.hadoop.fs.s3a.secret.key: ${{AWS_SECRET_ACCESS_KEY}}
            spark.driver.host: 127.0.0.1
            spark.driver.bindAddress: 127.0.0.1
            spark.driver.memory: ${{CDC_DRIVER_MEMORY:-2g}}
            spark.executor.memory: 2g
            spark.executor.cores: "2"
            spark.cores.max: "2"
            spark.sql.shuffle.partitions: "4"
            spark.default.parallelism: "4"
            spark.databricks.delta.snapshotPartitions: "2"
            spark.ui.enabled: "false"
            spark.ui.showConsoleProgress: "false"
            spark.log.level: WARN
        catalog:
          register: false
        """)
    )
    return path


def package_zip(dest: Path) -> Path:
    """`dest/cdc_core.zip` for `spark-submit --py-files` (what a multi-host cluster needs;
    here the executors could also import the editable install)."""
    target = dest / "cdc_core.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted((ROOT / "cdc_core").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, path.relative_to(ROOT))
    return target


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_jars() -> list[Path]:
    """Delta, the JDBC driver and hadoop-aws (with the AWS SDK bundle), in the jar cache."""
    try:
        return jars.resolve(jars.with_hadoop_aws(jars.default_coordinates()))
    except SetupError as e:
        unavailable(f"the s3a connector's jars cannot be resolved: {e}")
        raise  # unreachable: unavailable() skips or fails


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """`python -m moto.server` on 127.0.0.1 with the bucket `lake`; stopped afterwards."""
    try:
        import moto.server  # noqa: F401  (flask and flask-cors come with the dev extra)
        from pyarrow import fs as pafs
    except ImportError as e:
        unavailable(f"moto's server is not installed (pip install -e '.[dev]'): {e}")
    tmp = tmp_path_factory.mktemp("s3")
    log = tmp / "moto.log"
    proc, (port, _) = _start(
        lambda ports: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(ports[0])],
        lambda ports: _answers_s3(ports[0]),
        "moto to answer", log, env=submit_environment(), cwd=tmp,
    )  # fmt: skip
    try:
        fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", region=REGION,
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, allow_bucket_creation=True,
        )  # fmt: skip
        fs.create_dir(BUCKET)
        yield S3Server(f"http://127.0.0.1:{port}", ACCESS_KEY, SECRET_KEY, REGION, BUCKET, fs, log)
    finally:
        _stop(proc, timeout=10)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A standalone master and one worker (2 cores, 3g) on 127.0.0.1, ready when the worker has
    registered; stopped worker first (its executors go with it), then the master."""
    tmp = tmp_path_factory.mktemp("standalone")
    work, local = tmp / "work", tmp / "local"
    work.mkdir()
    local.mkdir()
    spark_class = Path(sys.executable).parent / "spark-class"
    if not spark_class.is_file():
        unavailable(f"{spark_class} not found: pyspark is not installed in this Python's venv")
    env = submit_environment(
        {
            "SPARK_HOME": str(jars.spark_home()),  # spark-class needs no find-spark-home then
            "SPARK_DAEMON_MEMORY": "512m",  # master and worker heaps (default 1g)
            # no REST submission server (else it takes the fixed port 6066), and no quiet move to
            # the next port when ours was taken meanwhile: the master exits, _start tries again
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false -Dspark.port.maxRetries=0",
            "SPARK_WORKER_DIR": str(work),
            "SPARK_LOCAL_DIRS": str(local),
            "SPARK_LOG_DIR": str(tmp),
        }
    )
    started: list[subprocess.Popen[bytes]] = []
    master_log, worker_log = tmp / "master.log", tmp / "worker.log"
    try:
        _, (port, ui_port) = _start(
            lambda ports: [str(spark_class), "org.apache.spark.deploy.master.Master",
                           "--host", "127.0.0.1", "--port", str(ports[0]),
                           "--webui-port", str(ports[1])],
            lambda ports: _master_url(ports[1]) == f"spark://127.0.0.1:{ports[0]}",
            "the master to start", master_log, env=env, cwd=tmp, timeout=120, on=started,
        )  # fmt: skip
        url, web_ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
        _start(
            lambda ports: [str(spark_class), "org.apache.spark.deploy.worker.Worker",
                           "--host", "127.0.0.1", "--port", str(ports[0]),
                           "--webui-port", str(ports[1]), "--cores", "2", "--memory", "3g",
                           "--work-dir", str(work), url],
            lambda _: _alive_workers(web_ui) >= 1,
            "the worker to register", worker_log, env=env, cwd=tmp, timeout=120, on=started,
        )  # fmt: skip
        yield Standalone(url, web_ui, work, (master_log, worker_log))
    finally:
        for proc in reversed(started):  # worker (and its executors), then master
            _stop(proc, timeout=30)
        for jar in work.glob("app-*/*/*.jar"):  # each application's copy of the jars (~650 MB
            jar.unlink()  # with the s3a connector); the executors' logs stay


# --- processes ---------------------------------------------------------------------------------


def _start(
    command: Callable[[tuple[int, int]], list[str]],
    ready: Callable[[tuple[int, int]], bool],
    what: str,
    log: Path,
    *,
    env: dict[str, str],
    cwd: Path,
    timeout: float = 30,
    on: list[subprocess.Popen[bytes]] | None = None,
) -> tuple[subprocess.Popen[bytes], tuple[int, int]]:
    """`command(ports)` (two free ports) in a process group of its own, its output appended to
    `log`, once `ready(ports)`. Started again on other ports when it exits first (someone took a
    port between free_port() and the bind). `on` gets the process as soon as it runs, so that a
    caller's clean-up stops it even when it never gets ready."""
    for _ in range(3):
        ports = (free_port(), free_port())
        with log.open("ab") as out:
            proc = subprocess.Popen(
                command(ports), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, cwd=cwd, start_new_session=True,
            )  # fmt: skip
        if on is not None:
            on.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if ready(ports):
                    return proc, ports
            time.sleep(0.25)
        if proc.poll() is None:  # still running, never ready
            _stop(proc, timeout=10)
            raise AssertionError(f"waited {timeout:.0f}s for {what}; {log}:\n{_tail(log)}")
    raise AssertionError(f"{what}: it exited at once, three times; {log}:\n{_tail(log)}")


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process group we started (the JVM and whatever it launched), then
    SIGKILL if it lingers."""
    if proc.poll() is not None:  # what is left of its group, if anything
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


def _answers_s3(port: int) -> bool:
    """moto (not whoever else might hold the port) answers ListBuckets."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
        return b"ListAllMyBucketsResult" in response.read()


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=2) as response:
        value: dict[str, Any] = json.load(response)
    return value


def _master_url(ui_port: int) -> str:
    return str(_get_json(f"http://127.0.0.1:{ui_port}/json/").get("url"))


def _alive_workers(web_ui: str) -> int:
    return int(_get_json(f"{web_ui}/json/").get("aliveworkers", 0))
