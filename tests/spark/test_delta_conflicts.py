"""A Delta commit that loses to a concurrent writer of the same table is transient (exit 75):
it wrote nothing, and the next run (or `--continuous`'s next try) redoes it idempotently."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_core.errors import TransientError
from cdc_core.transient import as_transient


def test_a_delete_that_loses_to_a_concurrent_delete_is_transient(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    spark.range(20).coalesce(1).write.format("delta").save(path)  # one task: one core left
    started, go = tmp_path / "started", tmp_path / "go"

    @F.udf(T.BooleanType())  # type: ignore[misc]
    def held(n: int) -> bool:  # holds the delete's scan until the other writer has committed
        started.touch()
        deadline = time.monotonic() + 300
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return n < 5

    failures: list[BaseException] = []

    def losing_delete() -> None:
        try:
            DeltaTable.forPath(spark, path).delete(held(F.col("id")))
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=losing_delete)
    thread.start()
    deadline = time.monotonic() + 300
    while not started.exists() and time.monotonic() < deadline:  # it has read its snapshot
        time.sleep(0.05)
    assert started.exists()
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id >= 10")  # commits first, in the same files
    go.touch()
    thread.join(300)
    assert not thread.is_alive()

    assert len(failures) == 1, failures
    mapped = as_transient(failures[0])
    assert isinstance(mapped, TransientError), repr(failures[0])[:2000]
    assert str(mapped).startswith("a concurrent writer committed to the same Delta table first: ")
    assert "Concurrent" in str(mapped)
    assert str(mapped).endswith("safe to retry: the next run resumes where this one stopped")
    ids = sorted(r.id for r in spark.read.format("delta").load(path).collect())
    assert ids == list(range(10))  # the loser wrote nothing
