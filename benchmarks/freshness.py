"""Benchmark: freshness of `ingest --continuous` under a steady workload.

    python benchmarks/freshness.py [--rate 1000] [--minutes 10] [--trigger 1]
    python benchmarks/freshness.py --rates 100 200 400 --minutes 4   # the highest flat rate
    python benchmarks/freshness.py --minutes 3 --conf spark.sql.codegen.wholeStage=false

A throwaway PostgreSQL gets the shop sample (customers, orders, order_items); the `orders`
pipeline runs `--continuous` in its own process (as users run it) while the shop workload
writes `rate` row changes per second for `minutes`. Freshness is measured per change: from its
commit in PostgreSQL (the staged `commit_time_us`) to the moment the batch that applied it
finished its silver MERGE (`visible_at` of the batch line). Prints p50, p99 and max over the
whole window, p50 per minute (does the lag grow?), the rate the workload reached, and the
baseline measured in the same run: the freshness of a batch that merges nothing but a single
change (what one idle batch costs). With `--rates` the same pipeline process holds each rate in
turn (the backlog drained between them) and says for each whether the lag stays flat: the last
minute's p50 within a quarter, or one idle batch, of the lowest p50 after the first minute.
`--conf KEY=VALUE` (repeatable) runs the pipeline with a Spark setting over conf/local.yaml's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from cdc_core.lake import Lake
from cdc_core.launch import submit_environment
from cdc_core.lsn import Lsn
from cdc_core.metrics import batches_file
from cdc_core.pg.local import throwaway_cluster
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, run_workload
from cdc_core.stager import staged_files

ROOT = Path(__file__).resolve().parents[1]


def pipeline_home(home: Path, dsn: str, trigger: float, conf: Sequence[str] = ()) -> None:
    (home / "pipelines").mkdir(parents=True)
    (home / "conf").mkdir()
    local = yaml.safe_load((ROOT / "conf" / "local.yaml").read_text())
    for setting in conf:  # --conf KEY=VALUE: a Spark setting to compare against the default
        key, _, value = setting.partition("=")
        local["spark"]["conf"][key] = value
    (home / "conf" / "local.yaml").write_text(yaml.safe_dump(local))
    (home / "pipelines" / "orders.yaml").write_text(
        textwrap.dedent(f"""\
        name: orders
        source:
          dsn: {dsn}
          slot: bench_orders
          publication: bench_orders
          tables: [public.customers, public.orders, public.order_items]
        snapshot:
          mode: initial
        capture:
          trigger_interval_s: {trigger}
        target:
          root: {home / "lake"}
        """)
    )


def batches(lake: Lake) -> list[dict[str, object]]:
    path = batches_file(lake)
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_for_batches(lake: Lake, n: int, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(batches(lake)) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the pipeline stopped or stalled (exit {proc.poll()})")
        time.sleep(0.5)


def per_change_lags(
    lake: Lake, lines: list[dict[str, object]], since_us: int
) -> list[tuple[int, float]]:
    """(commit time, seconds to visible) of every change a batch applied, committed after `since_us`."""
    files = staged_files(lake.changes)
    out: list[tuple[int, float]] = []
    for b in lines:
        if not b.get("lsn_from"):
            continue
        lo, hi = Lsn.parse(str(b["lsn_from"])), Lsn.parse(str(b["lsn_to"]))
        visible = datetime.fromisoformat(str(b["visible_at"])).timestamp() * 1e6
        for f in files:
            if f.start >= lo and f.end <= hi:
                times = pq.read_table(lake.changes / str(f), columns=["commit_time_us"])
                for t in times["commit_time_us"].to_pylist():
                    if t >= since_us:
                        out.append((t, (visible - t) / 1e6))
    return out


def quantiles(values: list[float]) -> tuple[float, float, float]:
    arr = pa.array(values, pa.float64())
    p50, p99 = pc.quantile(arr, q=[0.5, 0.99], interpolation="nearest").to_pylist()
    return p50, p99, pc.max(arr).as_py()


@dataclass(frozen=True)
class Window:
    """One steady rate held for a while, and the freshness of the changes committed in it."""

    asked: float
    reached: float
    lags: list[tuple[int, float]]  # (commit time, seconds to visible)
    start_us: int
    batch_seconds: list[float]
    minutes: float

    def per_minute(self) -> list[float]:
        """p50 of each whole minute of the window (the few changes committed as the workload
        stops, when the pipeline has the machine to itself, would flatter the last one)."""
        minute = 60 * 1_000_000
        buckets: dict[int, list[float]] = {}
        for t, s in self.lags:
            n = (t - self.start_us) // minute
            if n < int(self.minutes):
                buckets.setdefault(n, []).append(s)
        return [quantiles(v)[0] for _, v in sorted(buckets.items())]

    def verdict(self, baseline: float) -> str:
        if len(self.per_minute()) < 3:
            return "too short to tell (it takes 3 whole minutes)"
        return "flat" if self.flat(baseline) else "growing"

    def flat(self, baseline: float) -> bool:
        """The lag stops growing: the last minute's p50 is within a quarter (or one idle batch)
        of the lowest p50 after the first minute, the minute batches grow into the rate."""
        minutes = self.per_minute()
        if len(minutes) < 3:
            return False
        settled = min(minutes[1:])
        return minutes[-1] <= max(1.25 * settled, settled + baseline)


def steady_window(
    dsn: str, lake: Lake, proc: subprocess.Popen[str], rate: float, minutes: float
) -> Window:
    """The workload at `rate` for `minutes`, then until the pipeline has applied it all."""
    n = len(batches(lake))
    start_us = int(time.time() * 1e6)
    stats = run_workload(dsn, WorkloadSpec(duration_s=minutes * 60, rate=rate, concurrency=4))
    end_us = int(time.time() * 1e6)
    m = len(batches(lake))
    wait_for_batches(lake, m + 3, proc, 1800)  # the backlog drains
    lines = batches(lake)
    lags = [(t, s) for t, s in per_change_lags(lake, lines[n:], start_us) if t <= end_us]
    secs = [float(b["seconds"]) for b in lines[n:] if b.get("changes")]  # type: ignore[arg-type]
    reached = stats.rows_changed_committed / stats.seconds
    return Window(rate, reached, lags, start_us, secs, minutes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--trigger", type=float, default=1.0)
    parser.add_argument(
        "--rates", type=float, nargs="+",
        help="search: hold each rate for --minutes in turn (one pipeline process) and report "
        "which keep the lag flat",
    )  # fmt: skip
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the pipeline, over conf/local.yaml's (repeatable)",
    )
    args = parser.parse_args()
    for setting in args.conf:
        if not setting.partition("=")[0] or "=" not in setting:
            parser.error(f"--conf {setting!r}: expected KEY=VALUE")
    with throwaway_cluster("fresh") as cluster, tempfile.TemporaryDirectory() as tmp:
        dsn = cluster.dsn("postgres")
        create_schema(dsn)
        load_shop(dsn, customers=20_000)
        home = Path(tmp)
        pipeline_home(home, dsn, args.trigger, args.conf)
        lake = Lake(str(home / "lake"))
        log = (home / "ingest.log").open("w")  # a pipe would fill and block the job
        env = submit_environment({"CDC_HOME": str(home), "CDC_LOG_FORMAT": "text"})
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "orders", "--continuous"],
            env=env, cwd=home, stdout=log, stderr=log, text=True,
        )  # fmt: skip
        try:
            wait_for_batches(lake, 2, proc, 900)  # the snapshot, then one streaming batch
            # baseline: one change, then the freshness of the batch that applies it
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE customers SET full_name = full_name WHERE id = 1")
            n = len(batches(lake))
            wait_for_batches(lake, n + 2, proc, 300)
            base = [b for b in batches(lake)[n:] if b.get("changes")]
            baseline = float(base[0]["freshness_max_s"]) if base else float("nan")  # type: ignore[arg-type]
            windows = [
                steady_window(dsn, lake, proc, rate, args.minutes)
                for rate in (args.rates or [args.rate])
            ]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=600)
        assert proc.returncode == 0, (home / "ingest.log").read_text()[-3000:]
        print(f"baseline (one change, idle pipeline): {baseline:.2f} s; trigger {args.trigger} s")
        for w in windows:
            p50, p99, mx = quantiles([s for _, s in w.lags])
            trend = ", ".join(f"{x:.1f}" for x in w.per_minute())
            print(f"asked {w.asked:.0f}/s, reached {w.reached:.0f}/s, {len(w.lags)} changes: "
                  f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {mx:.2f} s, "
                  f"p50/baseline {p50 / baseline:.2f}; batches with changes {len(w.batch_seconds)}, "
                  f"batch seconds p50 {quantiles(w.batch_seconds)[0]:.1f}")  # fmt: skip
            print(f"  p50 per minute (s): {trend or '-'}: {w.verdict(baseline)}")
        flat = [w.reached for w in windows if w.flat(baseline)]
        if args.rates:
            print("highest rate with a flat lag: "
                  + (f"{max(flat):.0f}/s" if flat else "none of those tried"))  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
