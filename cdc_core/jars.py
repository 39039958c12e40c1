"""The jars Spark needs (Delta, PostgreSQL JDBC, extras): resolved from Maven Central once, cached.

Resolution runs Maven (`dependency:copy-dependencies`) when `mvn` is installed, else Spark's own
Ivy resolver (`spark.jars.packages`) in a child process. Jars Spark already ships are dropped,
and the rest is cached under a directory keyed by the coordinates, so later runs read local
files and need no network. Imports no pyspark: it is used before any JVM starts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

from cdc_core.errors import SetupError

POSTGRES_JDBC = "org.postgresql:postgresql:42.7.14"
SCALA_BINARY = "2.13"  # Spark 4 is built for Scala 2.13 only
HADOOP_AWS = "org.apache.hadoop:hadoop-aws"  # Hadoop's s3a:// connector (brings the AWS SDK v2)
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^/]*)\.jar$")


def delta_coordinate() -> str:
    """`io.delta:delta-spark_2.13:<v>` for the delta-spark Python package installed with PySpark."""
    try:
        version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError as e:
        raise SetupError(
            "the delta-spark Python package is not installed: pip install -e . (see README)"
        ) from e
    return f"io.delta:delta-spark_{SCALA_BINARY}:{version}"


def default_coordinates(extra: Iterable[str] = ()) -> list[str]:
    """Delta matching the installed PySpark, the PostgreSQL JDBC driver, then `extra`."""
    return [delta_coordinate(), POSTGRES_JDBC, *extra]


def hadoop_version() -> str:
    """The Hadoop client Spark ships: the version in its `jars/hadoop-client-api-<v>.jar`."""
    names = sorted(j.name for j in (spark_home() / "jars").glob("hadoop-client-api-*.jar"))
    versions = [m.group("version") for m in map(_JAR_NAME.match, names) if m]
    if len(versions) != 1:
        raise SetupError(
            f"cannot tell the Hadoop version of the Spark in {spark_home()}: expected one "
            f"jars/hadoop-client-api-<version>.jar, found {names or 'none'}"
        )
    return versions[0]


def hadoop_aws_coordinate() -> str:
    """`org.apache.hadoop:hadoop-aws:<v>` for the Hadoop client the installed PySpark ships (it
    must be that very version: another one fails at run time with NoSuchMethodError)."""
    return f"{HADOOP_AWS}:{hadoop_version()}"


def with_hadoop_aws(coordinates: Iterable[str]) -> list[str]:
    """`coordinates` and, unless already listed, the s3a connector matching Spark's Hadoop.
    A listed hadoop-aws of another version is refused rather than left to fail in a job."""
    wanted = hadoop_aws_coordinate()
    listed = list(coordinates)
    for coordinate in listed:
        if coordinate.rsplit(":", 1)[0] == HADOOP_AWS and coordinate != wanted:
            raise SetupError(
                f"spark.packages lists {coordinate}, but this Spark ships Hadoop "
                f"{hadoop_version()}: use {wanted} (or leave it out: it is added for s3a://)"
            )
    return listed if wanted in listed else [*listed, wanted]


def cache_root() -> Path:
    return Path(os.environ.get("CDC_JARS_DIR") or Path.home() / ".cache" / "cdc-lake" / "jars")


def spark_home() -> Path:
    """The installed PySpark's home (its `jars/` are Spark's own classpath)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed: pip install -e . (see README)")
    return Path(os.environ.get("SPARK_HOME") or Path(spec.origin).parent)


def artifact_of(jar_name: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`; Ivy's `io.delta_delta-spark_2.13-4.3.1.jar`
    -> `delta-spark_2.13`."""
    m = _JAR_NAME.match(jar_name)
    artifact = m.group("artifact") if m else jar_name.removesuffix(".jar")
    head, sep, rest = artifact.partition("_")
    return rest if sep and "." in head else artifact


def resolve(coordinates: Sequence[str], *, quiet: bool = False) -> list[Path]:
    """Local jar files for `coordinates` and their runtime dependencies, from cache or Maven."""
    key = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:16]
    target = cache_root() / key
    cached = _read_manifest(target)
    if cached is not None:
        return cached
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root()))
    try:
        if not quiet:
            print(f"resolving {', '.join(coordinates)} from Maven Central", file=sys.stderr)
        downloaded = _with_maven(coordinates, work) if shutil.which("mvn") else None
        if downloaded is None:
            downloaded = _with_spark_ivy(coordinates, work)
        kept = _drop_provided_by_spark(downloaded)
        out = work / "jars"
        out.mkdir()
        for jar in kept:
            _place(jar, out / jar.name)
        manifest = {"coordinates": list(coordinates), "jars": sorted(j.name for j in kept)}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
        try:
            out.rename(target)  # atomic publish; a concurrent resolver may have won
        except OSError:
            if _read_manifest(target) is None:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = _read_manifest(target)
    if result is None:
        raise SetupError(f"jar cache {target} is incomplete: delete it and run again")
    return result


def _place(jar: Path, target: Path) -> None:
    """A hard link when it can (the resolvers download under the cache's own work directory,
    and the AWS SDK bundle hadoop-aws needs is 612 MiB), else a copy."""
    try:
        os.link(jar, target)
    except OSError:
        shutil.copy2(jar, target)


def _read_manifest(folder: Path) -> list[Path] | None:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    jars = [folder / name for name in manifest.get("jars", [])]
    return jars if jars and all(j.is_file() for j in jars) else None


def _drop_provided_by_spark(jars: Iterable[Path]) -> list[Path]:
    """Spark's classpath comes first, so a second copy of its own jars is dead weight."""
    spark_jars = spark_home() / "jars"
    provided = {artifact_of(j.name) for j in spark_jars.glob("*.jar")}
    return [j for j in jars if artifact_of(j.name) not in provided]


def _with_maven(coordinates: Sequence[str], work: Path) -> list[Path] | None:
    deps = "\n".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version></dependency>".format(*c.split(":"))
        for c in coordinates
    )
    (work / "pom.xml").write_text(
        textwrap.dedent(f"""\
        <project xmlns="http://maven.apache.org/POM/4.0.0">
          <modelVersion>4.0.0</modelVersion>
          <groupId>cdc-lake</groupId><artifactId>jars</artifactId><version>1</version>
          <dependencies>{deps}</dependencies>
        </project>
        """)
    )
    out = work / "maven"
    proc = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print("maven could not resolve the jars, trying Spark's resolver:", *tail, file=sys.stderr)
        return None
    return sorted(out.glob("*.jar"))


_IVY_SCRIPT = """
import sys
from pyspark.sql import SparkSession
s = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.jars.packages", sys.argv[1]).config("spark.jars.ivy", sys.argv[2])
     .getOrCreate())
s.stop()
"""


def _with_spark_ivy(coordinates: Sequence[str], work: Path) -> list[Path]:
    ivy = work / "ivy"
    proc = subprocess.run(
        [sys.executable, "-c", _IVY_SCRIPT, ",".join(coordinates), str(ivy)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    jars = sorted((ivy / "jars").glob("*.jar"))
    if proc.returncode != 0 or not jars:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise SetupError(
            f"could not resolve {', '.join(coordinates)} from Maven Central "
            "(is https://repo1.maven.org reachable? On a cluster that has Delta, set "
            f"spark.jars: provided in conf/<env>.yaml):\n{tail}"
        )
    return jars


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Resolve and cache the jars Spark needs.")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument(
        "--s3a", action="store_true",
        help="also the s3a:// connector (hadoop-aws matching Spark's Hadoop, about 650 MB)",
    )  # fmt: skip
    parser.add_argument("packages", nargs="*", help="extra group:artifact:version coordinates")
    args = parser.parse_args(argv)
    try:
        coordinates = default_coordinates(args.packages)
        if args.s3a:
            coordinates = with_hadoop_aws(coordinates)
        jars = resolve(coordinates, quiet=args.quiet)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if not args.quiet:
        print("\n".join(str(j) for j in jars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
