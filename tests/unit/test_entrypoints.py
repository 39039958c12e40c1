"""The job entry and the `cdc` command: exit codes and one clear stderr line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: orders
source:
  dsn: postgresql://postgres@127.0.0.1:1/shop
  slot: orders_cdc
  publication: orders_cdc
  tables: [public.orders]
snapshot:
  mode: no_data
target:
  root: ./lake/orders
"""


def run(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("ORDERS_PG_DSN", "CDC_HOME")}
    environ |= {"CDC_HOME": str(home), **env}
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        capture_output=True,
        text=True,
        env=environ,
        cwd=home,
        timeout=120,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.yaml").write_text("spark:\n  master: local[1]\n")
    (tmp_path / "pipelines" / "orders.yaml").write_text(GOOD)
    return tmp_path


INGEST = str(ROOT / "jobs" / "ingest.py")
CDC = ["-m", "cdc_core.cli"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("  slot:", "  slott:"),
            "pipelines/orders.yaml: source.slott: unknown key (did you mean 'slot'?)",
        ),
        (("tables:", "tables: 3\n  x:"), "pipelines/orders.yaml: source.x: unknown key"),
        (
            ("target:\n  root: ./lake/orders\n", "target:\n  root: ${NOPE}\n"),
            "pipelines/orders.yaml: target.root: ${NOPE} is not set",
        ),
        (
            ("  slot: orders_cdc\n", ""),
            "pipelines/orders.yaml: source.slot: required key is missing",
        ),
        (("  slot: orders_cdc", "  slot: [x"), "pipelines/orders.yaml:5:"),
    ],
)
@pytest.mark.parametrize(
    "entry", [[INGEST, "--pipeline", "orders"], [*CDC, "doctor", "--pipeline", "orders"]]
)
def test_bad_configuration_exits_2_with_one_line(
    home: Path, entry: list[str], edit: tuple[str, str], expected: str
) -> None:
    path = home / "pipelines" / "orders.yaml"
    path.write_text(GOOD.replace(*edit))
    proc = run(entry, home)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {expected}"), lines[0]


def test_wrong_enum_exits_2(home: Path) -> None:
    (home / "pipelines" / "orders.yaml").write_text(GOOD.replace("mode: no_data", "mode: inital"))
    proc = run([INGEST, "--pipeline", "orders"], home)
    assert proc.returncode == 2
    assert "snapshot.mode: 'inital' is not one of" in proc.stderr
    assert "(did you mean 'initial'?)" in proc.stderr


def test_pipeline_with_no_file_exits_2(home: Path) -> None:
    proc = run([INGEST, "--pipeline", "ordres"], home)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: pipelines/ordres.yaml: no such pipeline file (available: orders) (did you mean 'orders'?)"
    )


def test_unreachable_source_is_transient_exit_75(home: Path) -> None:
    proc = run([INGEST, "--pipeline", "orders"], home)
    assert proc.returncode == 75, proc.stderr
    assert proc.stderr.strip().startswith(
        "error: cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/shop"
    )


def test_debug_adds_the_traceback(home: Path) -> None:
    proc = run([INGEST, "--pipeline", "nope", "--debug"], home)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr


def test_usage_errors_exit_2(home: Path) -> None:
    assert run([INGEST], home).returncode == 2
    assert run([*CDC, "workload", "--dsn", "x"], home).returncode == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--continuous", "--max-batches", "0"], "argument --max-batches: '0': give 1 or more"),
        (["--max-batches", "3"], "--max-batches N applies to --continuous"),
    ],
)  # fmt: skip
def test_a_batch_limit_that_cannot_hold_exits_2(home: Path, args: list[str], message: str) -> None:
    """Not one batch run anyway (0 was checked only after a batch), nor a limit ignored."""
    proc = run([INGEST, "--pipeline", "orders", *args], home)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_seconds_that_are_not_finite_exit_2(home: Path, value: str) -> None:
    """`--stale-after nan` made every pipeline fresh (and wrote NaN into --json)."""
    proc = run([*CDC, "status", "--pipeline", "orders", "--stale-after", value], home)
    assert proc.returncode == 2
    assert f"argument --stale-after: {value!r} is not a finite number" in proc.stderr
    proc = run([*CDC, "workload", "--dsn", "x", "--duration", "1", "--rate", value], home)
    assert proc.returncode == 2
    assert f"argument --rate: {value!r} is not a finite number" in proc.stderr


def test_two_pipelines_cannot_share_a_root(home: Path) -> None:
    """The first run claims the root for its pipeline (`_state/pipeline.json`); another
    pipeline pointed at it stops before anything of the lake is touched, ingest, a snapshot
    request or maintenance alike, naming both pipelines and the way out."""
    (home / "pipelines" / "other.yaml").write_text(GOOD.replace("name: orders", "name: other"))
    proc = run([INGEST, "--pipeline", "orders"], home)  # claims, then cannot reach the source
    assert proc.returncode == 75, proc.stderr
    owner = home / "lake" / "orders" / "_state" / "pipeline.json"
    assert json.loads(owner.read_text()) == {"pipeline": "orders"}
    for args in (
        [INGEST, "--pipeline", "other"],
        [*CDC, "snapshot", "--pipeline", "other", "--table", "public.orders"],
        [str(ROOT / "jobs" / "maintain.py"), "--pipeline", "other"],
    ):
        proc = run(args, home)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == (
            f"error: target.root {home}/lake/orders holds the lake of pipeline 'orders', not "
            "'other': two pipelines cannot share a root (their staged changes, positions and "
            "mirrors would mix); give 'other' a root of its own. If it is 'orders' renamed, "
            f"delete {owner} and run it again"
        )
    assert not (home / "lake" / "orders" / "_state" / "snapshots").exists()
    assert run([INGEST, "--pipeline", "orders"], home).returncode == 75  # its own root: on
