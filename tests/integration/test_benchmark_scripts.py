"""The benchmark scripts run end to end on small workloads (their figures are not checked: the
README's come from full-size runs). A benchmark that no longer runs goes unnoticed otherwise:
two had stopped running before these tests (bronze gained fields the silver benchmark's
hand-made rows lacked; the snapshot benchmark's load was ambiguous below 32,768 rows)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_capture_benchmark_runs_rounds_and_prints_each_readers_median() -> None:
    out = bench("benchmarks/capture_throughput.py", "--changes", "3000", "--transactions", "3",
                "--rounds", "2")  # fmt: skip
    assert len(re.findall(r"^round \d: server decode .* 3,007 messages", out, re.M)) == 2, out
    staged = re.findall(r"^ +(stream|sql) reader drain\+stage: 3,000 changes in", out, re.M)
    assert sorted(staged) == ["sql", "sql", "stream", "stream"], out
    for reader in ("stream", "sql"):
        assert re.search(
            rf"^ *{reader} reader: ratio .* median \d+\.\d\d over 2 rounds", out, re.M
        ), out


def test_the_peek_fetch_benchmark_times_every_way_of_fetching() -> None:
    out = bench("benchmarks/peek_fetch.py", "--changes", "3000", "--rounds", "1")
    assert re.search(r"^round 1: server decode", out, re.M), out
    assert len(re.findall(r"^  \S.* \d+\.\d\d s, ratio \d+\.\d\d$", out, re.M)) == 5, out


@pytest.mark.slow
def test_the_snapshot_benchmark_compares_the_product_with_the_plain_copy() -> None:
    out = bench("benchmarks/snapshot.py", "--rows", "20000", "--chunk-size", "5000")
    assert "20,000 rows read" in out, out
    assert re.search(r"^ratio \(product / plain JDBC -> Delta\): \d+\.\d\d$", out, re.M), out


@pytest.mark.slow
def test_the_silver_benchmark_ends_with_both_tables_equal() -> None:
    out = bench("benchmarks/silver_merge.py", "--rows", "20000", "--changes", "4000")
    assert re.search(r"^ratio \(product / plain MERGE throughput\): \d+\.\d\d$", out, re.M), out
    assert "both tables hold the same rows" in out, out


@pytest.mark.slow
def test_the_freshness_benchmark_measures_a_short_window_without_calling_it_flat_or_growing() -> (
    None
):
    out = bench("benchmarks/freshness.py", "--rate", "200", "--minutes", "0.5")
    assert re.search(r"^baseline \(one change, idle pipeline\): \d+\.\d\d s", out, re.M), out
    assert re.search(r"^asked 200/s, reached \d+/s, \d+ changes: p50 \d+\.\d\d s", out, re.M), out
    assert "p50 per minute (s): -: too short to tell (it takes 3 whole minutes)" in out, out


@pytest.mark.slow
def test_the_wide_benchmark_ends_with_both_tables_equal_at_each_width() -> None:
    out = bench("benchmarks/wide_merge.py", "--widths", "3", "9", "--rows", "50", "--batches", "4")
    for width in (3, 9):
        assert re.search(
            rf"^{width} columns: product \d+\.\d\d s, plain MERGE \d+\.\d\d s, ratio \d+\.\d\d .*"
            "both tables hold the same rows$", out, re.M,
        ), out  # fmt: skip
