"""A class data sharing archive for the JVMs the integration tier starts.

Each `ingest`, `snapshot` or `validate` child starts a JVM that loads some 15,000 Spark and
Delta classes, a third of its time on 2 cores. The JVM can map them from an archive instead
(AppCDS); this makes one at the start of the session, from a run that does what ingest does
(Delta create, append, MERGE, Parquet, a Python worker), and hands it to the children through
`SPARK_SUBMIT_OPTS`. The archive only changes how classes are loaded, never what a run does;
without one the children run as before.

A truncated archive makes the JVM die of SIGBUS, so the archive is written under a temporary
name, the writing JVM is waited for, a second JVM must start with it, and only then does it
get its name.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("tests.jvm_archive")

_WORKLOAD = r"""
import sys
from delta.tables import DeltaTable
from pyspark import SparkContext
from cdc_core.config import load_env
from cdc_core.spark import build_spark

spark = build_spark(load_env()[0].spark)
root = sys.argv[1]
if sys.argv[2] == "make":
    df = spark.range(100).selectExpr("id", "cast(id as string) AS v")
    df.write.format("delta").save(f"{root}/t")
    df.write.parquet(f"{root}/p")
    staged = spark.read.parquet(f"{root}/p").localCheckpoint()
    upd = staged.mapInArrow(lambda batches: batches, staged.schema)
    (DeltaTable.forPath(spark, f"{root}/t").alias("t")
        .merge(upd.alias("s"), "s.id = t.id")
        .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    spark.read.format("delta").load(f"{root}/t").groupBy("v").count().collect()
    spark.sql(f"DESCRIBE HISTORY delta.`{root}/t`").collect()
else:
    spark.range(3).count()
spark.stop()
gateway = SparkContext._gateway
proc = getattr(gateway, "proc", None)
if proc is not None:  # the JVM writes the archive as it exits: wait for it
    proc.stdin.close()
    proc.wait(timeout=300)
"""


def options(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"


def build(directory: Path) -> Path | None:
    """The archive made in `directory`, or None (logged) when the JVM would not make one."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "workload.py"
    script.write_text(_WORKLOAD)
    writing = directory / "classes.jsa.tmp"
    archive = directory / "classes.jsa"
    make = _run(script, directory, "make", f"-XX:ArchiveClassesAtExit={writing}")
    if make.returncode != 0 or not writing.is_file():
        log.warning("no class archive (%s): children start without one", make.stderr[-500:])
        return None
    check = _run(script, directory, "check", options(writing))
    if check.returncode != 0:
        log.warning("the class archive does not load (%s): not used", check.stderr[-500:])
        return None
    os.replace(writing, archive)
    return archive


def _run(
    script: Path, directory: Path, mode: str, java_options: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPARK_SUBMIT_OPTS=java_options)
    return subprocess.run(
        [sys.executable, str(script), str(directory / mode), mode],
        env=env, capture_output=True, text=True, timeout=600, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
