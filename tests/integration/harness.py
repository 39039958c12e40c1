"""Pipelines in a temporary project home, and ingest run the way users run it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cdc_core.lake import Lake
from cdc_core.launch import submit_environment
from cdc_core.lsn import Lsn
from tests.integration.privileges import PASSWORD, PASSWORD_VAR, product_dsn

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Pipeline:
    """A pipeline file in a temporary project home, and how to run ingest on it."""

    home: Path
    dsn: str  # the superuser's, for the tests' own work; the pipeline file has the product's
    slot: str

    @property
    def lake(self) -> Lake:
        return Lake(str(self.home / "lake"))

    @property
    def changes(self) -> Path:
        return self.lake.changes

    def ingest(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`python jobs/ingest.py --pipeline p ARGS`; `--capture-only` skips Spark."""
        return subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", *args],
            env=self.env(), cwd=self.home, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def start_ingest(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", *args],
            env=self.env(), cwd=self.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def cdc(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`cdc ARGS` (`snapshot --pipeline p --table T`, say) in the pipeline's home."""
        return subprocess.run(
            [sys.executable, "-m", "cdc_core.cli", *args], env=self.env(), cwd=self.home,
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    def edit(self, old: str, new: str) -> None:
        """Change the pipeline file."""
        path = self.home / "pipelines" / "p.yaml"
        text = path.read_text()
        assert old in text, f"{old!r} not in the pipeline file"
        path.write_text(text.replace(old, new))

    def env(self) -> dict[str, str]:
        return submit_environment({"CDC_HOME": str(self.home), PASSWORD_VAR: PASSWORD})

    def confirmed(self) -> Lsn:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        assert row is not None
        return Lsn.parse(row[0])


def make_pipeline(
    home: Path, dsn: str, tables: list[str], *, extra: str = "", source_extra: str = "",
    snapshot: str = "no_data", snapshot_extra: str = "", root: str | None = None,
) -> Pipeline:  # fmt: skip
    """A pipeline `p` of `tables` in `home` (its lake in home/lake), with a slot of its own; it
    runs as the least-privilege role (`privileges`) on `dsn`'s database, `dsn` stays the tests'.
    `root`: the lake's root instead of home/lake (`Pipeline.lake` then does not apply). No
    `tables`: the file lists none (the include lists in `source_extra` choose them)."""
    slot = f"cdc_{home.name[-20:].lower().replace('-', '_')}_{os.getpid()}"
    slot = "".join(ch for ch in slot if ch.isalnum() or ch == "_")[:63]
    (home / "pipelines").mkdir(parents=True, exist_ok=True)
    (home / "conf").mkdir(exist_ok=True)
    (home / "conf" / "local.yaml").write_text((ROOT / "conf" / "local.yaml").read_text())
    table_list = ", ".join(f"'{t}'" for t in tables)
    listed = f"\n          tables: [{table_list}]" if tables else ""  # dedented below
    (home / "pipelines" / "p.yaml").write_text(
        textwrap.dedent(f"""\
        name: p
        source:
          dsn: {product_dsn(dsn)}
          slot: {slot}
          publication: pub_{slot}{listed}
        """)
        + textwrap.indent(textwrap.dedent(source_extra), "  ")
        + f"snapshot:\n  mode: {snapshot}\n"
        + textwrap.indent(textwrap.dedent(snapshot_extra), "  ")
        + f"target:\n  root: {root or home / 'lake'}\n"
        + textwrap.dedent(extra)
    )
    return Pipeline(home, dsn, slot)


def sql(dsn: str, *statements: str) -> None:
    """Run statements one by one, each committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def ingest_ok(p: Pipeline) -> str:
    """One `ingest` run that must succeed; its output."""
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def resnapshot_when_needed(p: Pipeline) -> str:
    """The runbooks' way out of a lost position: `snapshot.mode` from initial to when_needed,
    then one run that must start a new slot and a new snapshot; its output."""
    p.edit("mode: initial", "mode: when_needed")
    run = p.ingest()
    assert run.returncode == 0, run.stderr[-3000:]
    assert (
        f"slot {p.slot} lost the stored position: starting a new slot and a new snapshot"
        in run.stderr
    )
    return run.stdout
