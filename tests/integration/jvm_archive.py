"""How the JVMs the integration tier starts are started: from a class data sharing archive,
and with the client compiler only.

Each `ingest`, `snapshot` or `validate` child starts a JVM that loads some 15,000 Spark and
Delta classes and runs a batch of a few hundred rows at most before it exits. On 2 cores:

- The JVM can map those classes from an archive instead of loading them (AppCDS). The tier
  makes one at the start of the session, from a run that does what ingest does (Delta create,
  append, MERGE, Parquet, a Python worker), and hands it to the children. A trivial batch
  went from 42 s to 35 s with it (2026-11-28). The archive only changes how classes are
  loaded, never what a run does; without one the children load their classes as before.
- `-XX:TieredStopAtLevel=1` keeps the JIT at its first tier: a short run never earns back
  what the optimising compiler costs on the second core. Measured in the same session,
  alternating, 4 runs each of a 20,000-change batch: 35.5 s against 43.4 s (medians).
- `-XX:ReservedCodeCacheSize=240m` gives that JIT the code cache a default JVM has. With the
  first tier only, the JVM reserves 48 MB, as for a JVM without tiers, and a child that ran
  a few thousand changes filled it in 27-42 s: compiling stopped for good ("CodeCache is
  full. Compiler has been disabled") and the rest of the run was interpreted. Two children
  of one CI run then failed in a MERGE (2026-11-28), where no child had failed before the
  first tier came in.

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

from cdc_core.launch import submit_environment
from tests.conftest import exclusive

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


_C1 = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
_LOG4J = Path(__file__).resolve().parents[2] / "conf" / "spark" / "log4j2.properties"


def environment(archive: Path | None) -> dict[str, str]:
    """What a child's environment needs to start its JVM the tier's way (`archive` None: the
    first tier of the JIT only).

    The JVM will not archive, nor map an archive under, a class path holding a non-empty
    directory, and spark-submit puts `SPARK_CONF_DIR` first on it: the children get an empty
    one (made next to the archive) and the project's log4j2 configuration by name instead."""
    if archive is None:
        return {"SPARK_SUBMIT_OPTS": _C1}
    return _jvm(archive.parent, f"-XX:SharedArchiveFile={archive} -Xshare:auto {_C1}")


def shared(directory: Path) -> Path | None:
    """The archive in `directory`, made by the first of a run's workers to ask for it; the
    others wait for it (or for the word that the JVM would not make one)."""
    directory.mkdir(parents=True, exist_ok=True)
    archive, refused = directory / "classes.jsa", directory / "refused"
    with exclusive(directory / "build.lock"):
        if archive.is_file():
            return archive
        if refused.is_file():
            return None
        built = build(directory)
        if built is None:
            refused.touch()
        return built


def build(directory: Path) -> Path | None:
    """The archive made in `directory`, or None (logged) when the JVM would not make one."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "workload.py"
    script.write_text(_WORKLOAD)
    writing = directory / "classes.jsa.tmp"
    archive = directory / "classes.jsa"
    make = _run(script, directory, "make", f"-XX:ArchiveClassesAtExit={writing}")
    if make.returncode != 0 or not writing.is_file():
        why = (make.stdout + make.stderr)[-800:]
        log.warning("no class archive (%s): children start without one", why)
        return None
    # -Xshare:on: a JVM that cannot map the archive (a class path that differs, say) fails,
    # where the children's -Xshare:auto would go on silently without it
    check = _run(script, directory, "check", f"-XX:SharedArchiveFile={writing} -Xshare:on")
    if check.returncode != 0:
        why = (check.stdout + check.stderr)[-800:]
        log.warning("the class archive does not load (%s): not used", why)
        return None
    os.replace(writing, archive)
    return archive


def _jvm(directory: Path, java_options: str) -> dict[str, str]:
    """An empty SPARK_CONF_DIR in `directory`, and `java_options` with the log4j2 file."""
    conf = directory / "spark-conf"
    conf.mkdir(exist_ok=True)
    return {
        "SPARK_CONF_DIR": str(conf),
        "SPARK_SUBMIT_OPTS": f"{java_options} -Dlog4j2.configurationFile={_LOG4J}",
    }


def _run(
    script: Path, directory: Path, mode: str, java_options: str
) -> subprocess.CompletedProcess[str]:
    env = submit_environment(_jvm(directory, java_options))  # the children's class path
    return subprocess.run(
        [sys.executable, str(script), str(directory / mode), mode],
        env=env, capture_output=True, text=True, timeout=600, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
