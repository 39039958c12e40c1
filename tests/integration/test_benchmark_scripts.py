"""The capture benchmark runs end to end on a small workload (its figures are not checked: the
README's come from full-size runs). A benchmark that no longer runs would go unnoticed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_capture_benchmark_runs_rounds_and_prints_each_readers_median() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/capture_throughput.py",
         "--changes", "3000", "--transactions", "3", "--rounds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert len(re.findall(r"^round \d: server decode .* 3,007 messages", out, re.M)) == 2, out
    staged = re.findall(r"^ +(stream|sql) reader drain\+stage: 3,000 changes in", out, re.M)
    assert sorted(staged) == ["sql", "sql", "stream", "stream"], out
    for reader in ("stream", "sql"):
        assert re.search(
            rf"^ *{reader} reader: ratio .* median \d+\.\d\d over 2 rounds", out, re.M
        ), out
