"""Durable progress kept inside the Delta tables themselves: a watermark in each commit's metadata.

A stage that writes a Delta table records how far it got in that same commit
(`userMetadata`), so the progress and the data can never disagree: a crash either lost both
or kept both. The next run reads the newest such record from the table's log (`delta_log`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import types
from collections.abc import Iterator, Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from cdc_core import delta_log
from cdc_core.lake import local_path
from cdc_core.spark import Spark, session_of
from cdc_core.storage import Location, S3Options, bucket_of, location

USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
HISTORY_DEPTH = 200  # commits searched for the newest watermark (maintenance adds a few)


def read_watermark(spark: Spark, path: str, key: str) -> dict[str, object] | None:
    """The newest commit metadata of table `path` that records `key`, or None (no such commit,
    or no table). A local table needs no Spark session (`spark` may be one still starting)."""
    found = _newest_record(spark, path, key)
    return found[1] if found else None


def watermark_depth(spark: SparkSession, path: str, key: str) -> int | None:
    """How many commits of table `path` came after the newest one that records `key` (0: it is
    the newest); None when none of the last HISTORY_DEPTH commits records it."""
    found = _newest_record(spark, path, key)
    return found[0] if found else None


def _newest_record(spark: Spark, path: str, key: str) -> tuple[int, dict[str, object]] | None:
    """(commits after it, metadata) of the newest commit whose metadata records `key`."""
    return delta_log.newest_record(_table_at(spark, path), key, HISTORY_DEPTH)


def table_version(spark: Spark, path: str) -> int:
    """The newest commit version of the table at `path`, -1 when there is none."""
    version = delta_log.newest_version(_table_at(spark, path))
    return -1 if version is None else version


def _table_at(spark: Spark, path: str) -> Location:
    """The table at `path` for reading its log directly, in milliseconds where Delta's history
    costs a Spark job: a local folder (no session needed), or on an object store through the
    session's own s3a settings (the lake's `Lake.of` reads the same ones)."""
    local = local_path(path)
    if local is not None:
        return local
    conf = _settings(session_of(spark).sparkContext)
    return location(path, S3Options.from_spark_conf(conf, bucket_of(path)))


@functools.lru_cache(maxsize=2)
def _settings(context: SparkContext) -> Mapping[str, str]:
    """A running context's settings (where the lake's s3a settings are, as `Lake.of` reads
    them), asked once: they are fixed when it starts. Each ask is a JVM round trip."""
    return types.MappingProxyType(dict(context.getConf().getAll()))


@contextlib.contextmanager
def committing(
    spark: SparkSession, metadata: Mapping[str, object], *, app_id: str | None = None,
    version: int | None = None,
) -> Iterator[None]:  # fmt: skip
    """Writes inside the block record `metadata`; with `app_id`/`version` Delta also skips a
    write that this app already committed at that version or later (idempotent DML)."""
    settings = {USER_METADATA: json.dumps(metadata, sort_keys=True)}
    if app_id is not None and version is not None:
        settings |= {TXN_APP_ID: app_id, TXN_VERSION: str(version)}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(key)
