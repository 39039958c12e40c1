"""Crash anywhere: ingest killed with SIGKILL at every named point of every stage, and at random
moments, more than 50 times, while the workload writes throughout. After one clean run every
mirror equals its source, and bronze holds each committed change exactly once (checked against
a second slot decoded by test_decoding, read independently on the server).

A kill at a named point is `CDC_FAULT=<point>@<n>` (cdc_core/faults.py): the job kills itself
the n-th time it reaches the point, and says where on stderr first. The schedule is drawn from
a seed (`CDC_CRASH_SEED`, printed), so a failing schedule can be replayed exactly.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_core.faults import POINTS
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.snapshot import load_jobs
from tests.integration.conftest import PgServer
from tests.integration.ground_truth import create_truth_slot, read_truth
from tests.integration.harness import ROOT, Pipeline, make_pipeline
from tests.integration.mirror import assert_mirror_equals_source
from tests.integration.test_snapshot import SHOP, workload

SEED = int(os.environ.get("CDC_CRASH_SEED", "20261122"))

SNAPSHOT = ("window.low_watermark", "snapshot.after_export", "window.high_watermark",
            "snapshot.chunk_read", "snapshot.chunk_done")  # fmt: skip
STREAM = ("capture.transaction", "stager.before_publish", "stager.after_publish",
          "confirm.recorded", "confirm.sent")  # fmt: skip
LAKE = ("bronze.before_commit", "bronze.between_commits", "bronze.after_commit",
        "silver.before_merge", "silver.after_merge", "batch.before_record")  # fmt: skip


@dataclass
class Kills:
    """Where the kills landed, and the runs that ended before reaching their point."""

    landed: collections.Counter[str] = field(default_factory=collections.Counter)
    missed: list[str] = field(default_factory=list)
    busy: int = 0  # runs that found the slot still held by the killed one (exit 75): rerun

    def total(self) -> int:
        return sum(self.landed.values())


def run_with_fault(p: Pipeline, fault: str, kills: Kills) -> None:
    """One `ingest --once` that should die at `fault`; any outcome but that kill, a clean
    finish (the point was not reached) or a retryable exit 75 is a failure."""
    for _ in range(5):
        began = time.monotonic()
        run = p.ingest_with_fault(fault, timeout=600)
        print(f"{fault}: exit {run.returncode} after {time.monotonic() - began:.1f} s", flush=True)
        if run.returncode == 75:
            kills.busy += 1
            time.sleep(1)
            continue
        if run.returncode == -signal.SIGKILL:
            assert f"fault injected: {fault}" in run.stderr, run.stderr[-2000:]
            kills.landed[fault.partition("@")[0]] += 1
        else:
            assert run.returncode == 0, f"{fault}: exit {run.returncode}\n{run.stderr[-4000:]}"
            kills.missed.append(fault)
        return
    raise AssertionError(f"{fault}: five runs in a row exited 75")


def kill_at_random(p: Pipeline, rng: random.Random, kills: Kills) -> None:
    """A `--continuous` run killed from outside after a random time: wherever it was."""
    proc = p.start_ingest("--continuous")
    time.sleep(rng.uniform(3.0, 20.0))
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert alive, f"the continuous run ended before its kill: {err[-3000:]}"
    kills.landed["random moment"] += 1


def finish_snapshots(p: Pipeline) -> None:
    """A clean run: the snapshot in hand ends, so the next kills land where they are meant."""
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-4000:]
    assert all(job.finished or job.stopped for job in load_jobs(p.lake))


@pytest.mark.crash
def test_crash_anywhere_loses_nothing_and_repeats_nothing(
    pg: PgServer, database: str, tmp_path: Path, spark: SparkSession
) -> None:
    print(f"crash schedule seed {SEED} (CDC_CRASH_SEED replays it)")
    rng = random.Random(SEED)
    assert set(SNAPSHOT + STREAM + LAKE) <= set(POINTS)
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=40)
    p = make_pipeline(
        tmp_path, dsn, [t.qualified for t in SHOP], snapshot="initial",
        source_extra="provide.transaction.metadata: true\n",
        snapshot_extra="chunk.size: 30\nmax.threads: 2\n",
    )  # fmt: skip
    kills = Kills()
    # the first run creates the slot and dies in the initial snapshot; the truth slot starts
    # right after it, before any workload transaction, so both see the same changes
    run_with_fault(p, "snapshot.chunk_read@1", kills)
    assert kills.total() == 1, kills
    truth_slot = f"truth_{p.slot}"[:63]
    create_truth_slot(dsn, truth_slot)

    with workload(dsn, rate=25, seed=SEED % 1000):
        for point in rng.sample(SNAPSHOT, len(SNAPSHOT)):  # inside the initial snapshot
            run_with_fault(p, f"{point}@1", kills)
        finish_snapshots(p)
        # an incremental snapshot requested while the stream runs: kills inside its windows
        request = subprocess.run(
            [sys.executable, "-m", "cdc_core.cli", "snapshot", "--pipeline", "p",
             "--table", "public.orders"],
            env=p.env() | {"PYTHONPATH": str(ROOT)}, cwd=p.home, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        assert request.returncode == 0, request.stderr
        for point in rng.sample(SNAPSHOT, 3):
            run_with_fault(p, f"{point}@1", kills)
        finish_snapshots(p)
        # the stream: capture kills are cheap (the slot is read while Spark still starts),
        # so they are most of the schedule; lake kills need Spark's work before them
        stream = [
            f"{point}@{1 if point.startswith('stager') else rng.randint(1, 2)}"
            for point in STREAM * 7
        ]  # a run publishes one change file: stager@2 is rare
        lake = [f"{point}@{rng.randint(1, 3) if point.startswith('silver') else 1}"
                for point in LAKE]  # fmt: skip
        mixed = stream + lake
        rng.shuffle(mixed)
        for n, fault in enumerate(mixed):
            run_with_fault(p, fault, kills)
            if n % 20 == 19:
                kill_at_random(p, rng, kills)
        for _ in range(20):  # runs that ended before their point are made up for
            if kills.total() >= 52:
                break
            run_with_fault(p, f"{rng.choice(STREAM)}@1", kills)

    print(f"kills: {kills.total()} ({dict(kills.landed)}); not reached: {kills.missed}; "
          f"reruns after exit 75: {kills.busy}")  # fmt: skip
    assert kills.total() >= 50, kills
    assert set(kills.landed) >= set(SNAPSHOT + STREAM + LAKE), kills  # every point was hit

    for _ in range(3):  # clean runs until no snapshot work is left
        run = p.ingest()
        assert run.returncode == 0, run.stderr[-4000:]
        if all(job.finished or job.stopped for job in load_jobs(p.lake)):
            break
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-4000:]
    for table in SHOP:
        assert_mirror_equals_source(spark, p.lake, dsn, table)
    assert_bronze_holds_each_change_once(spark, p, dsn, truth_slot)


def assert_bronze_holds_each_change_once(
    spark: SparkSession, p: Pipeline, dsn: str, truth_slot: str
) -> None:
    names = {t.qualified for t in SHOP}
    truth: collections.Counter[tuple[int, str, str]] = collections.Counter()
    for c in read_truth(dsn, truth_slot):
        if c.table not in names:
            continue
        if c.op == "u" and c.old is not None:  # the key changed: a delete and a create, as
            truth.update([(c.xid, c.table, "d"), (c.xid, c.table, "c")])  # Debezium sends
        else:
            truth[(c.xid, c.table, c.op)] += 1
    stream = (
        spark.read.format("delta").load(p.lake.bronze)
        .where(F.col("op").isin("c", "u", "d", "t"))  # reads are op r
    )  # fmt: skip
    # a change's place is (commit_lsn, seq); a key change is two events at one place
    twice = stream.groupBy("commit_lsn", "seq", "op").count().where("count > 1").limit(3).collect()
    assert not twice, f"changes in bronze more than once: {twice}"
    landed = collections.Counter(
        (r["txId"], r["source_table"], r["op"])
        for r in stream.select("source.txId", "source_table", "op").collect()
    )
    assert sum(truth.values()) > 1000, "the workload wrote too little to prove anything"
    missing, extra = truth - landed, landed - truth
    assert not missing, f"{sum(missing.values())} changes never reached bronze: {list(missing)[:3]}"
    assert not extra, (
        f"{sum(extra.values())} bronze changes the server never made: {list(extra)[:3]}"
    )
    print(f"bronze holds the {sum(truth.values()):,} changes test_decoding saw, each once")


def test_a_fault_point_that_does_not_exist_is_refused(tmp_path: Path, pg: PgServer) -> None:
    """A misspelt point would make every crash case pass without a crash."""
    p = make_pipeline(tmp_path, pg.dsn(), ["public.t"])
    run = p.ingest_with_fault("bronze.before_comit@1", timeout=120)
    assert run.returncode == 2, run.stderr
    assert "CDC_FAULT='bronze.before_comit@1'" in run.stderr
    assert "bronze.before_commit" in run.stderr  # the list of the points that exist
