"""The one place that builds a SparkSession: Delta extensions, the product's jars, env settings.

With `spark.jars: resolve` the Delta and PostgreSQL JDBC jars come from `cdc_core.jars` (Maven
Central once, then a local cache), and Hadoop's s3a connector too when the lake is on s3a:// or
the environment sets `spark.hadoop.fs.s3a.*`. Launched by plain `python`, they go on the command
line of the JVM PySpark starts. Under `spark-submit` the JVM already runs, so they are added to
its driver class loader before the SparkContext exists, and shipped to executors with
`spark.jars`. With `spark.jars: provided` (Databricks) nothing is added.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import ParamSpec, TypeVar

from pyspark import SparkContext
from pyspark.sql import SparkSession

from cdc_core.config import SparkSettings
from cdc_core.errors import SetupError, causes, text_of
from cdc_core.jars import default_coordinates, hadoop_aws_coordinate, resolve, with_hadoop_aws

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
S3A_SETTINGS = "spark.hadoop.fs.s3a."

# Defaults an environment may override, set when the product starts the JVM (README,
# "Freshness"):
# - A batch of a few tables runs some 400 generated classes; Spark keeps 100 by default, so each
#   batch compiled them all again (and the JIT then compiled them again): about 15% of a
#   continuous batch's time on 2 cores.
# - Adaptive execution coalesces a small shuffle to partitions of its advisory size, not to one
#   per core: a MERGE of a few thousand changes writes one file into its mirror, not one per
#   shuffle partition. A mirror's files grew four times slower, and every MERGE until the next
#   OPTIMIZE touches them all.
_DEFAULTS = {
    "spark.sql.codegen.cache.maxEntries": "2000",
    "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
}
# Settings the product relies on, whatever the environment says.
_RUNTIME = {
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
}


def build_spark(
    settings: SparkSettings, app_name: str = "cdc", *, root: str | None = None
) -> SparkSession:
    """The session for `settings`; an already active session (notebook, test) is reused.
    `root`, the lake's, adds the s3a connector when it is an s3a:// location."""
    session = SparkSession.getActiveSession()
    if session is None:
        session = _new_session(settings, app_name, root)
    for key, value in _RUNTIME.items():
        session.conf.set(key, value)
    _require_delta(session, settings)
    if uses_s3a(settings, root):
        _require_s3a(session, settings)
    return session


def uses_s3a(settings: SparkSettings, root: str | None = None) -> bool:
    """Whether a session needs Hadoop's s3a connector: the lake's root is s3a://, or the
    environment configures the connector (spark.hadoop.fs.s3a.*)."""
    return (root or "").startswith("s3a://") or any(
        k.startswith(S3A_SETTINGS) for k in settings.conf
    )


def coordinates_for(settings: SparkSettings, root: str | None = None) -> list[str]:
    """The Maven coordinates `spark.jars: resolve` adds: Delta, the JDBC driver, the
    environment's `spark.packages`, and hadoop-aws matching Spark's Hadoop when s3a is used."""
    coordinates = default_coordinates(settings.packages)
    return with_hadoop_aws(coordinates) if uses_s3a(settings, root) else coordinates


class SessionStarting:
    """`build_spark` on a daemon thread: the JVM takes seconds to start, and a run has work
    that needs no Spark first (the source's checks, reading the slot, staging). Calling it
    waits for the session (or raises what building it raised). Daemon: a run that fails
    before it needs Spark exits at once, and PySpark's JVM ends with its parent."""

    def __init__(
        self, settings: SparkSettings, app_name: str = "cdc", *, root: str | None = None
    ) -> None:
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._active_in: int | None = None  # the thread the session was made active in
        self._thread = threading.Thread(
            target=self._build, args=(settings, app_name, root), name="spark-start", daemon=True
        )
        self._thread.start()

    def _build(self, settings: SparkSettings, app_name: str, root: str | None) -> None:
        try:
            self._session = build_spark(settings, app_name, root=root)
        except BaseException as e:  # handed to the thread that asks for the session
            self._error = e

    @property
    def ready(self) -> bool:
        """Whether the session was built (False while it starts, or if building it failed)."""
        return not self._thread.is_alive() and self._session is not None

    def __call__(self) -> SparkSession:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        if self._active_in != threading.get_ident():  # the JVM's is per thread: the caller's
            jvm = self._session.sparkContext._jvm
            assert jvm is not None
            jvm.SparkSession.setActiveSession(self._session._jsparkSession)
            self._active_in = threading.get_ident()
        return self._session


Spark = SparkSession | Callable[[], SparkSession]  # a session, or one that is starting


def session_of(spark: Spark) -> SparkSession:
    return spark() if callable(spark) else spark


def each_in_session(
    spark: SparkSession, work: Callable[[SparkSession, T], R], items: Sequence[T], threads: int
) -> list[R]:
    """`work(session, item)` for every item, in order, up to `threads` at a time. Each thread
    has a session of its own (`newSession`: the same SparkContext, its own SQL settings, so
    per-commit settings such as Delta's userMetadata stay with their thread). Every item runs
    even when one fails; the first failure is raised after."""
    if threads <= 1 or len(items) <= 1:
        return [work(spark, item) for item in items]
    local = threading.local()

    def run(item: T) -> R:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = spark.newSession()
            for key, value in _RUNTIME.items():
                session.conf.set(key, value)
            jvm = session.sparkContext._jvm
            assert jvm is not None
            jvm.SparkSession.setActiveSession(session._jsparkSession)
        return work(session, item)

    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="silver") as pool:
        futures = [pool.submit(run, item) for item in items]
        wait(futures)
    return [f.result() for f in futures]


def built_once(build: Callable[P, R]) -> Callable[P, R]:
    """`build`, a pure builder of Spark expressions (hashable arguments, a result nobody
    changes), run once per arguments. Each column operation is a Py4J round trip (a `F.col` is
    several), and every batch built the same expressions for each mirror again: 3,700 round
    trips for a mirror's one-change batch, 830 with them kept, on the driver's Python side that
    the mirrors merged at once share (README, "Freshness"). An expression only names columns (a
    Spark 4 `Column` is its unresolved node), so it serves any DataFrame of any session and
    thread; the JVM gateway is part of the key, so a new JVM builds anew. Threads that miss at
    once may each build: the same expressions, one kept."""
    kept = functools.lru_cache(maxsize=512)(
        lambda gateway, args, kwargs: build(*args, **dict(kwargs))
    )

    @functools.wraps(build)
    def cached(*args: P.args, **kwargs: P.kwargs) -> R:
        result: R = kept(SparkContext._gateway, args, tuple(sorted(kwargs.items())))
        return result

    return cached


def _launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _new_session(settings: SparkSettings, app_name: str, root: str | None = None) -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    jars: list[Path] = []
    if settings.jars == "resolve":
        jars = resolve(coordinates_for(settings, root))
    submitted = _launched_by_spark_submit()
    if not submitted:
        builder = builder.master(settings.master)
    conf = _DEFAULTS | dict(settings.conf)
    # Python workers run the interpreter the driver runs (its packages), unless the platform
    # chose one; PySpark reads only this variable, when the SparkContext starts
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if jars:
        if submitted:
            _add_to_driver_class_loader(jars)
        conf["spark.jars"] = _join_jars(jars, conf.get("spark.jars", ""))
    if settings.jars == "resolve" or DELTA_EXTENSION not in conf.get("spark.sql.extensions", ""):
        extensions = [e for e in conf.get("spark.sql.extensions", "").split(",") if e]
        conf["spark.sql.extensions"] = ",".join(dict.fromkeys([DELTA_EXTENSION, *extensions]))
        conf.setdefault("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _join_jars(jars: Sequence[Path], existing: str) -> str:
    return ",".join([*(str(j) for j in jars), *(e for e in existing.split(",") if e)])


def _add_to_driver_class_loader(jars: Sequence[Path]) -> None:
    """spark-submit started the JVM without our jars: add them before the SparkContext exists."""
    SparkContext._ensure_initialized()  # connects to spark-submit's gateway
    jvm = SparkContext._jvm
    assert jvm is not None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    if not hasattr(loader, "addURL"):
        raise SetupError(
            "spark-submit's class loader does not accept jars at run time: pass them with "
            "--jars, or set spark.jars: provided if the cluster has Delta"
        )
    for jar in jars:
        loader.addURL(jvm.java.io.File(str(jar)).toURI().toURL())


def delta_available(session: SparkSession) -> bool:
    """Whether Delta's catalog class is loadable in the driver JVM."""
    jvm = session.sparkContext._jvm
    assert jvm is not None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_CATALOG, False, loader)
    except Exception as e:  # py4j wraps ClassNotFoundException
        if "ClassNotFoundException" in str(e):
            return False
        raise
    return True


def s3a_available(session: SparkSession) -> bool:
    """Whether Hadoop in the driver JVM has a file system for s3a:// (the class `fs.s3a.impl`
    names: hadoop-aws's S3AFileSystem, or a platform's own, shaded one)."""
    jvm = session.sparkContext._jvm
    assert jvm is not None
    conf = session.sparkContext._jsc.hadoopConfiguration()
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", conf)
    except Exception as e:  # py4j wraps the Java exception
        if "ClassNotFoundException" in str(e) or "UnsupportedFileSystemException" in str(e):
            return False
        raise
    return True


def _require_s3a(session: SparkSession, settings: SparkSettings) -> None:
    if s3a_available(session):
        return
    if settings.jars == "provided":
        raise SetupError(
            "the lake is on s3a:// but Hadoop's s3a connector is not on this cluster's classpath "
            f"although spark.jars is 'provided': install {hadoop_aws_coordinate()} (and the AWS "
            "SDK bundle it depends on) on the cluster, or set spark.jars: resolve"
        )
    raise SetupError(
        "Hadoop's s3a connector did not load into Spark: the session was created before the "
        "jars were added; build it with cdc_core.spark.build_spark before any other SparkSession"
    )


def _require_delta(session: SparkSession, settings: SparkSettings) -> None:
    if delta_available(session):
        return
    if settings.jars == "provided":
        raise SetupError(
            "Delta Lake is not on this cluster's classpath although spark.jars is 'provided': "
            "install io.delta:delta-spark on the cluster, or set spark.jars: resolve"
        )
    raise SetupError(
        "Delta Lake did not load into Spark: the session was created before the jars were "
        "added; build it with cdc_core.spark.build_spark before any other SparkSession"
    )


def driver_died(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the driver's JVM is gone: Py4J lost its
    connection, or a Spark job failed on java.lang.OutOfMemoryError (local mode: Spark's
    handler then ends the JVM)."""
    for current in causes(error):
        if type(current).__name__ == "Py4JNetworkError" or isinstance(
            current, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)
        ):
            return True
        if _spark_side(current):
            text = text_of(current)
            if text is None or "java.lang.OutOfMemoryError" in text:
                return True
    return False


def driver_dying(error: BaseException, spark: Spark, *, grace_s: float = 3.0) -> bool:
    """Whether `error` came with the driver's JVM dying: `driver_died`, or a Spark error while
    the JVM goes (its gateway no longer answers, or its SparkContext stopped), watched for
    `grace_s`. A task's OutOfMemoryError makes Spark's handler exit the JVM, and its shutdown
    stops the SparkContext first: jobs then fail with errors that do not name the cause (a
    job cancelled because the context shut down), while the JVM still answers for a moment."""
    if driver_died(error):
        return True
    starting = isinstance(spark, SessionStarting) and not spark.ready
    if starting or not any(map(_spark_side, causes(error))):
        return False
    context = session_of(spark).sparkContext
    deadline = time.monotonic() + grace_s
    while True:
        try:
            if context._jsc is None or context._jsc.sc().isStopped():
                return True
        except Exception:  # the gateway is gone with the JVM
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _spark_side(error: BaseException) -> bool:
    return type(error).__module__.startswith(("py4j", "pyspark"))
