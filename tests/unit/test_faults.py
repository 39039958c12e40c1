"""Named fault points: `CDC_FAULT=<point>@<n>` kills the process the n-th time it passes."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from cdc_core import faults
from cdc_core.errors import UsageError

PROGRAM = """
import sys
from cdc_core import faults
for n in range(1, 4):
    print(f"pass {n}", flush=True)
    faults.point("bronze.after_commit")
    faults.point("silver.before_merge")
"""


def run(fault: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM], env={"CDC_FAULT": fault},
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_the_process_dies_by_sigkill_the_nth_time_it_reaches_the_point() -> None:
    second = run("silver.before_merge@2")
    assert second.returncode == -signal.SIGKILL
    assert second.stdout.split() == ["pass", "1", "pass", "2"]
    assert second.stderr == "fault injected: silver.before_merge@2\n"
    first = run("bronze.after_commit")
    assert first.returncode == -signal.SIGKILL
    assert first.stdout.split() == ["pass", "1"]


def test_a_point_never_reached_often_enough_lets_the_run_finish() -> None:
    done = run("bronze.after_commit@4")
    assert done.returncode == 0
    assert done.stdout.split() == ["pass", "1", "pass", "2", "pass", "3"]


@pytest.mark.parametrize(
    "wanted", ["bronze.after_comit", "silver.before_merge@0", "confirm.sent@x"]
)
def test_a_fault_that_names_no_point_is_refused(
    wanted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENV, wanted)
    with pytest.raises(UsageError, match="expected one of"):
        faults.check_env()


def test_every_point_in_the_code_is_listed() -> None:
    """A point the list misses could not be named by a test; one the code lost never fires."""
    import pathlib
    import re

    root = pathlib.Path(faults.__file__).parent
    used = {
        m.group(1)
        for path in root.rglob("*.py")
        for m in re.finditer(r'faults\.point\("([^"]+)"\)', path.read_text())
    }
    assert used == set(faults.POINTS)
