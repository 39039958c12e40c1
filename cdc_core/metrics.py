"""What each batch did, for `cdc status`, dashboards and alerts: one JSON line per batch.

`<root>/_state/batches.jsonl` gets a line when a batch ends (`--once` runs are one batch): when
it ran, the LSN range it staged, its changes and transactions, and its freshness: for every
change it made visible in silver, the time from the change's commit in PostgreSQL to the end of
the silver MERGE that applied it (p50, p99, max). Debezium's metric names are kept where they
carry over (`MilliSecondsBehindSource`: the newest change's lag; `TotalNumberOfEventsSeen` and
`NumberOfCommittedTransactions`: totals of this process; `SnapshotRunning`, `RowsScanned`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_core.lake import Lake

_TAIL_BYTES = 64 << 10  # a batch line is far smaller


def batches_file(lake: Lake) -> Path:
    return lake.state / "batches.jsonl"


@dataclass(frozen=True)
class Freshness:
    """Seconds from source commit to visible in silver, over the changes of one batch."""

    p50_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None
    newest_s: float | None = None  # the most recently committed change's lag

    @classmethod
    def of(cls, commit_times_us: pa.Array, visible_us: int) -> Freshness:
        if not len(commit_times_us):
            return cls()
        lag = pc.divide(pc.subtract(pa.scalar(visible_us, pa.int64()), commit_times_us), 1e6)
        p50, p99 = pc.quantile(lag, q=[0.5, 0.99], interpolation="nearest").to_pylist()
        newest = (visible_us - pc.max(commit_times_us).as_py()) / 1e6
        return cls(p50, p99, pc.max(lag).as_py(), newest)


def freshness(staged: Sequence[Path], visible_us: int) -> Freshness:
    """Freshness of the changes in `staged` files, all visible in silver at `visible_us`."""
    if not staged:
        return Freshness()
    times = pa.chunked_array(
        [pq.read_table(p, columns=["commit_time_us"])["commit_time_us"] for p in staged]
    ).combine_chunks()
    return Freshness.of(times, visible_us)


@dataclass
class Totals:
    """Counters over the batches of one process (Debezium's are per connector task)."""

    events: int = 0
    transactions: int = 0
    batches: int = 0


def now_us() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1_000_000)


def iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="milliseconds")


def last_batch(lake: Lake) -> dict[str, Any] | None:
    """The newest batch line, or None."""
    path = batches_file(lake)
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            data = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash mid-write
        if isinstance(data, dict):
            return data
    return None


def record_batch(lake: Lake, record: dict[str, Any]) -> None:
    """Append one batch line, durably."""
    path = batches_file(lake)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
