"""The Spark half of a run: staged files -> bronze -> silver, each resuming where it stopped;
snapshots finish once silver holds them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core import dropped
from cdc_core.bronze import (
    BronzeOptions,
    BronzeSummary,
    append_staged,
    applied_end,
    pending_files,
)
from cdc_core.config import Config
from cdc_core.errors import DriverDiedError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.notifications import NotificationType, Notifier
from cdc_core.pgtypes import TypeModes
from cdc_core.silver import CaughtUp, SilverSettings, TableResult, apply_silver, sweep
from cdc_core.snapshot import SnapshotJob, TableSnapshot
from cdc_core.spark import Spark, driver_dying, session_of
from cdc_core.stager import StagedFile, largest_change, staged_files
from cdc_core.state import read_stream
from cdc_core.unavailable import Placeholder

log = logging.getLogger("cdc_core.apply")


def silver_settings(config: Config) -> SilverSettings:
    s = config.pipeline.silver
    modes = TypeModes(
        decimal=s.decimal_handling_mode, money_fraction_digits=s.money_fraction_digits,
        time_precision=s.time_precision_mode,
        interval=s.interval_handling_mode, binary=s.binary_handling_mode,
        hstore=s.hstore_handling_mode,
    )  # fmt: skip
    catalog = config.env.catalog
    return SilverSettings(
        modes, s.soft_delete, catalog.register, catalog.database,
        s.column_propagate_source_type.patterns, s.datatype_propagate_source_type.patterns,
        s.max_threads, config.pipeline.source.slot, s.event_processing_failure_handling_mode,
        config.pipeline.name,
    )  # fmt: skip


def apply_staged(
    spark: Spark, lake: Lake, config: Config, *, streaming: bool = True,
    caught: CaughtUp | None = None,
    before_append: Callable[[Sequence[StagedFile]], None] | None = None,
) -> tuple[BronzeSummary, list[TableResult], int | None]:  # fmt: skip
    """Append every staged file not yet in bronze, then merge every table's pending rows.
    `before_append` sees those files first (maintenance may remove one once bronze has it).

    Returns the stream frontier too: bronze holds every change committed before it, so silver
    takes snapshot reads up to it (a read's place in the stream must not be passed before the
    changes committed around it are in). None: the pipeline does not stream, nothing to wait for.
    `caught`: what is known of the mirrors (`CaughtUp`), for batches without snapshots.
    `spark` may be a session still starting: a batch with nothing to apply never waits for it.
    """
    recorded = read_stream(lake) if streaming else None  # before listing files
    source = config.pipeline.source
    options = BronzeOptions(source.provide_transaction_metadata,
                            Placeholder.of(source.unavailable_value_placeholder),
                            source.skipped_operations.codes,
                            source.skip_messages_without_change)  # fmt: skip
    files = pending_files(spark, lake)
    if before_append is not None and files:
        before_append(files)
    with if_driver_dies(spark, lambda: driver_died_applying(lake, config, files)):
        bronze = (
            append_staged(session_of(spark), lake, files, options=options)
            if files
            else BronzeSummary(0, 0, None)
        )
        frontier = None
        if streaming:
            frontier = applied_end(spark, lake).value
            if recorded is not None:
                frontier = max(frontier, Lsn.parse(str(recorded["confirmed"])).value)
        tables = list(source.followed)  # a dropped table's last changes too
        settings = silver_settings(config)
        silver = apply_silver(spark, lake, tables, settings, frontier=frontier, caught=caught)
        dropped.applied(lake, config, [r.table for r in silver if r.error is None], frontier)
    return bronze, silver, frontier


def finish_snapshots(
    spark: SparkSession, lake: Lake, config: Config, jobs: Sequence[SnapshotJob], *,
    results: Sequence[TableResult], frontier: int | None,
) -> list[str]:  # fmt: skip
    """Mark done every table whose snapshot silver now holds (all its reads are before the
    frontier and its merge went through); a full snapshot first sweeps the rows it did not
    find. Returns the tables finished."""
    failed = {r.table for r in results if r.error}
    settings = silver_settings(config)
    notify = Notifier.of(config.pipeline, lake)
    finished = []
    for job in jobs:
        for part in job.tables:
            if job.stopped or part.done or part.last is None or part.table.qualified in failed:
                continue
            if frontier is not None and part.last > frontier:
                continue  # the stream has not reached its last read yet
            path = lake.silver(part.table)
            if part.full and part.first is not None and DeltaTable.isDeltaTable(spark, path):
                sweep(spark, path, (part.first, -1), settings)
                if "c" not in config.pipeline.source.skipped_operations.codes:
                    _warn_unseen_values(spark, path, config.pipeline.name, job, part)
            part.done = True
            if job.finished:  # silver holds every table it read; sent again if a crash comes first
                job.end_pause(time.time_ns() // 1000)  # silver finished what it had read
                notify.job(job, NotificationType.COMPLETED)
            job.save(lake)
            finished.append(part.table.qualified)
            log.info("snapshot %s: %s done (%d rows read)", job.id, part.table, part.rows)
    return finished


def _warn_unseen_values(
    spark: SparkSession, path: str, pipeline: str, job: SnapshotJob, part: TableSnapshot
) -> None:
    """After a whole-table snapshot every mirror row has every value: the snapshot read each
    row whole, and a change since that did not resend a value (unchanged TOAST) kept the one
    the mirror had. A row still without one (`_cdc_unavailable`) is a row no read found whole,
    which the mirror would keep so without a word: said here, with the rows to read again
    (`cdc validate` shows them too). Known cause: a change of a surrogate chunk key
    (surrogate-key) that moved a row out of a chunk not yet read into one read before."""
    mirror = spark.read.format("delta").load(path)
    lacking = mirror.where((F.size("_cdc_unavailable") > 0) & ~F.col("_cdc_deleted"))
    count = lacking.count()
    if not count:
        return
    key = [c for c in part.plan.key if c in mirror.columns]
    some = lacking.select(*key, "_cdc_unavailable").limit(5).collect()
    shown = " ".join(
        "(" + ", ".join(f"{c}={r[c]}" for c in key) + ": " + ", ".join(r["_cdc_unavailable"]) + ")"
        for r in some
    )  # fmt: skip
    log.warning(
        "snapshot %s of %s: %d mirror rows lack values no read brought (unchanged TOASTed "
        "values a change did not resend), e.g. %s; read them again: cdc snapshot --pipeline %s "
        "--table %s, with --where on their key to read only them", job.id, part.table, count,
        shown, pipeline, part.table.qualified,
    )  # fmt: skip


@contextmanager
def if_driver_dies(spark: Spark, say: Callable[[], str]) -> Iterator[None]:
    """An error that comes with the driver's JVM dying (`driver_dying`) becomes a DriverDiedError
    saying `say()`: whichever Spark call the death reaches first, the run says what happened
    and the remedy, not an unexpected Py4J error whose text went with the JVM."""
    try:
        yield
    except DriverDiedError:
        raise  # said already, by the step it died in
    except Exception as e:
        if getattr(e, _OUTLIVED, False):  # an inner step watched the driver outlive it already
            raise
        if not driver_dying(e, spark):
            setattr(e, _OUTLIVED, True)
            raise
        raise DriverDiedError(say()) from e


_OUTLIVED = "_cdc_driver_outlived"  # on an error the driver outlived: not watched again


_OUT_OF_HEAP = "most likely out of heap (java.lang.OutOfMemoryError in its log above)"


def _more_memory(config: Config, then: str) -> str:
    memory = config.env.spark.conf.get("spark.driver.memory", "Spark's default (1g)")
    return (
        f"Give the driver more memory (spark.driver.memory, now {memory}; conf/local.yaml reads "
        f"it from CDC_DRIVER_MEMORY) and run again: {then}"
    )


_NOTHING_LOST = "nothing was lost, the changes stay staged and the slot is confirmed only past them"


def driver_died_applying(lake: Lake, config: Config, files: list[StagedFile]) -> str:
    """What to say when the Spark driver's JVM died applying staged changes: most often a
    change too large for its heap (Spark holds a value several times over while it turns it
    into an envelope and a typed row). Names the largest change of the batch and the remedy."""
    said = (
        f"{DriverDiedError.SAID} while applying staged changes to bronze and silver, "
        + _OUT_OF_HEAP
    )
    recent = files or staged_files(lake.changes)[-20:]  # the files this batch applied or had
    largest = largest_change(lake.changes, recent)
    if largest is not None:
        said += (
            f". The largest change of the batch is {largest.size / (1 << 20):,.0f} MB "
            f"(table {largest.table}, LSN {largest.lsn}); a change takes several times its "
            "size in driver heap, once per change being written at the same time"
        )
    return f"{said}. {_more_memory(config, _NOTHING_LOST)}"


def driver_died_reading(config: Config, jobs: Sequence[SnapshotJob]) -> str:
    """What to say when the driver's JVM died reading snapshot chunks: a row too large for its
    heap, held several times over as it becomes an envelope, once per chunk read at a time."""
    tables = ", ".join(
        str(t.table) for job in jobs for t in job.tables if not job.stopped and not t.done
    )
    threads = config.pipeline.snapshot.max_threads
    return (
        f"{DriverDiedError.SAID} while reading snapshot chunks of {tables}, "
        f"{_OUT_OF_HEAP}; a row takes several times its size in driver heap, once per chunk "
        f"being read at the same time (snapshot.max.threads, now {threads}). "
        + _more_memory(
            config, f"the snapshot resumes from the chunks not yet done, and {_NOTHING_LOST}"
        )
    )


def driver_died_in_batch(config: Config) -> str:
    """What to say when the driver's JVM died in a batch's other Spark work (finishing
    snapshots, the metrics table)."""
    died = f"{DriverDiedError.SAID} during the batch, {_OUT_OF_HEAP}"
    return f"{died}. {_more_memory(config, _NOTHING_LOST)}"
