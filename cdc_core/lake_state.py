"""Durable progress kept inside the Delta tables themselves: a watermark in each commit's metadata.

A stage that writes a Delta table records how far it got in that same commit
(`userMetadata`), so the progress and the data can never disagree: a crash either lost both
or kept both. The next run reads the newest such record from the table's history.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from cdc_core import delta_log
from cdc_core.lake import local_path
from cdc_core.spark import Spark, session_of

USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
HISTORY_DEPTH = 200  # commits searched for the newest watermark (maintenance adds a few)


def read_watermark(spark: Spark, path: str, key: str) -> dict[str, object] | None:
    """The newest commit metadata of table `path` that records `key`, or None. A local table
    needs no Spark session (`spark` may be one still starting)."""
    if local_path(path) is None and not DeltaTable.isDeltaTable(session_of(spark), path):
        return None
    found = _newest_record(spark, path, key)
    return found[1] if found else None


def watermark_depth(spark: SparkSession, path: str, key: str) -> int | None:
    """How many commits of table `path` came after the newest one that records `key` (0: it is
    the newest); None when none of the last HISTORY_DEPTH commits records it."""
    found = _newest_record(spark, path, key)
    return found[0] if found else None


def _newest_record(spark: Spark, path: str, key: str) -> tuple[int, dict[str, object]] | None:
    """(commits after it, metadata) of the newest commit whose metadata records `key`. A local
    table's log is read directly (milliseconds, where Delta's history costs a Spark job)."""
    local = local_path(path)
    if local is not None:
        return delta_log.newest_record(local, key, HISTORY_DEPTH)
    history = (
        DeltaTable.forPath(session_of(spark), path)
        .history(HISTORY_DEPTH)
        .select("version", "userMetadata")
    )
    rows = history.orderBy("version", ascending=False).collect()
    for depth, row in enumerate(rows):
        if not row.userMetadata:
            continue
        try:
            data = json.loads(row.userMetadata)
        except ValueError:
            continue  # someone else's metadata
        if isinstance(data, dict) and key in data:
            return depth, data
    return None


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


def table_version(spark: Spark, path: str) -> int:
    """The newest commit version of the table at `path`, -1 when there is none (a local
    table's without a Spark session)."""
    local = local_path(path)
    if local is not None:
        version = delta_log.newest_version(local)
        return -1 if version is None else version
    session = session_of(spark)
    if not DeltaTable.isDeltaTable(session, path):  # a mirror not made yet
        return -1
    row = DeltaTable.forPath(session, path).history(1).select("version").first()
    return int(row[0]) if row else -1
