"""Which bronze rows retention may delete: merged rows of a table, messages nothing merges, and
a table's reset markers once its mirror has merged them (silver applies them as a TRUNCATE)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from cdc_core.maintenance import retention_condition
from cdc_core.reset_marker import RESET_PREFIX, ResetMarker

SCHEMA = (
    "name string, source_table string, commit_lsn long, seq long, ts_ms long, "
    "source struct<ts_ms: long>, message struct<prefix: string, content: binary>"
)
OLD = 1_000  # committed long before the cutoff
NEW = ResetMarker("public.items", "cdc_other").encode()  # whichever slot: bronze holds it


def row(name: str, table: str, lsn: int, prefix: str | None = None, content: str = "") -> tuple:
    message = (prefix, content.encode()) if prefix else None
    return (name, table, lsn, 0, OLD, (OLD,), message)


def test_a_reset_marker_stays_until_its_mirror_has_merged_it(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [
            row("items merged", "public.items", 100),
            row("items pending", "public.items", 300),
            row("outbox message", "_messages", 300, "outbox", "{}"),
            row("items reset, merged", "_messages", 150, RESET_PREFIX, "public.items"),
            row("items reset, pending", "_messages", 250, RESET_PREFIX, "public.items"),
            row("notes reset, no mirror", "_messages", 50, RESET_PREFIX, "public.notes"),
            row("items reset for a slot, merged", "_messages", 160, RESET_PREFIX, NEW),
            row("items reset for a slot, pending", "_messages", 260, RESET_PREFIX, NEW),
            row("notes row, no mirror", "public.notes", 50),
        ],
        SCHEMA,
    )
    deleted = rows.where(retention_condition({"public.items": (200, 0)}, cutoff_ms=OLD + 1))
    assert sorted(r["name"] for r in deleted.collect()) == [
        "items merged", "items reset for a slot, merged", "items reset, merged", "outbox message",
    ]  # fmt: skip
    assert rows.where(retention_condition({"public.items": (200, 0)}, cutoff_ms=OLD)).count() == 0
