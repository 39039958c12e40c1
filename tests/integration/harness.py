"""Pipelines in a temporary project home, and ingest (and maintenance) run the way users run
them: as a child process, or as `cdc_core.jobs.ingest.main` (`maintain.main`) in this test
process's Spark session.

A child starts a JVM, Spark and Delta from cold for a batch of a few rows: about 27-35 s a run
on 2 cores, against 9-10 s for the same run in the session the test worker already has
(2026-11-30). Most runs therefore run here (`Pipeline.ingest`), the way a notebook or a
Databricks wheel task runs the job: `main` returns the exit code, the output it prints and the
log lines it writes are what the run's stdout and stderr hold. A run that needs a process of
its own gets a child:
- `--continuous` (signals) and `--capture-only` (no Spark to save);
- an environment other than the project's `conf/local.yaml`, or `--env`: a running JVM keeps
  the settings it started with; also `TZ` or `CDC_DRIVER_MEMORY` set by the test;
- `child=True`: what the test checks is the process itself (all it writes, the JVM's too),
  or its driver is meant to die (out of heap): the worker's driver would die with it, and the
  worker's later cases after it, so an in-process run that kills it fails its case saying so;
- `CDC_TEST_INGEST=child` in the environment: every run a child, as before this harness.
Fault points (`CDC_FAULT`) kill the process they fire in: a run with one set is a child too
(the tests that use them start their children themselves).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from cdc_core.cli import JsonLogFormatter
from cdc_core.errors import DriverDiedError
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

    def ingest(
        self, *args: str, timeout: float = 900, child: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """`python jobs/ingest.py --pipeline p ARGS`, in this process unless it needs a child
        (module docstring) or `child`; `--capture-only` skips Spark."""
        from cdc_core.jobs import ingest

        return self._job(ingest.main, "ingest", args, timeout, child)

    def maintain(
        self, *args: str, timeout: float = 900, child: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """`python jobs/maintain.py --pipeline p ARGS`, in this process unless it needs a child
        (as `ingest`)."""
        from cdc_core.jobs import maintain

        return self._job(maintain.main, "maintain", args, timeout, child)

    def _job(
        self, main: Callable[[Sequence[str]], int], job: str, args: tuple[str, ...],
        timeout: float, child: bool,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        command = [sys.executable, str(ROOT / "jobs" / f"{job}.py"), "--pipeline", "p", *args]
        if child or not self._runs_here(args):
            return subprocess.run(
                command, env=self.env(), cwd=self.home, capture_output=True, text=True,
                timeout=timeout, check=False,
            )  # fmt: skip
        with _as_a_run_here(self, command, timeout) as (out, err):
            code = main(command[2:])
        if DriverDiedError.SAID in err.getvalue():
            pytest.fail(
                f"a {job} run killed the test worker's Spark driver, and every later case of this "
                "worker fails with it: a run meant to exhaust the driver needs child=True\n"
                + err.getvalue()[-3000:]
            )
        return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())

    def _runs_here(self, args: tuple[str, ...]) -> bool:
        if os.environ.get("CDC_TEST_INGEST") == "child" or {*args} & _CHILD_ARGS:
            return False
        if any(var in os.environ for var in _CHILD_ENV):
            return False
        conf = sorted(p.name for p in (self.home / "conf").iterdir())
        return (
            conf == ["local.yaml"]
            and (self.home / "conf" / "local.yaml").read_bytes()
            == (ROOT / "conf" / "local.yaml").read_bytes()
        )

    def ingest_here(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`ingest ARGS` in this process even where `ingest` starts a child (`--continuous`
        with `--max-batches`, sent no signal), so that hooks a test sets (`faults.hooked`)
        run in it."""
        from cdc_core.jobs import ingest

        command = [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", *args]
        with _as_a_run_here(self, command, timeout) as (out, err):
            code = ingest.main(command[2:])
        return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())

    def ingest_with_fault(
        self, fault: str, *args: str, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """`python jobs/ingest.py --pipeline p ARGS` in a child with `CDC_FAULT=fault` set: a
        fault point kills the process it fires in (`cdc_core.faults`)."""
        return subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "ingest.py"), "--pipeline", "p", *args],
            env=self.env() | {"CDC_FAULT": fault}, cwd=self.home, capture_output=True, text=True,
            timeout=timeout, check=False,
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

    def batches(self) -> int:
        """Batches the pipeline has recorded (`_state/batches.jsonl` lines), 0 before any."""
        from cdc_core.metrics import batches_file

        path = batches_file(self.lake)
        return len(path.read_text().splitlines()) if path.exists() else 0

    def confirmed(self) -> Lsn:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        assert row is not None
        return Lsn.parse(row[0])


_CHILD_ARGS = frozenset({"--continuous", "--capture-only", "--env"})
_CHILD_ENV = ("TZ", "CDC_DRIVER_MEMORY", "CDC_FAULT")  # read at a JVM's start; a fault kills


@contextlib.contextmanager
def _as_a_run_here(
    p: Pipeline, argv: list[str], timeout: float
) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """A run of `argv` in this process as a child would have it: the pipeline's home as its
    working directory and `CDC_HOME`, its prints and its log lines (JSON, as a child's are off
    a terminal) in the buffers yielded. A run past `timeout` ends the test process with every
    thread's traceback (a child would have been killed; a hung worker would hang the tier)."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)  # before the job's basicConfig, which then adds none of its own
    root.setLevel(logging.DEBUG if "--debug" in argv else logging.INFO)
    faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
    try:
        with (
            pytest.MonkeyPatch.context() as patch,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            for name, value in p.env().items():
                if os.environ.get(name) != value:
                    patch.setenv(name, value)
            patch.chdir(p.home)
            patch.setattr(sys, "argv", argv[1:])
            yield out, err
    finally:
        faulthandler.cancel_dump_traceback_later()
        root.removeHandler(handler)
        root.setLevel(level)


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


@contextlib.contextmanager
def slot_reader(dsn: str, slot: str, publication: str, name: str) -> Iterator[int]:
    """`pg_recvlogical` streaming from `slot` (pgoutput, through `publication`) as application
    `name` (a Debezium connector still attached, say); yields the slot's active_pid once it
    reads, and waits at the end until the slot is free again."""
    other = subprocess.Popen(
        ["pg_recvlogical", "-d", dsn, "-S", slot, "--start", "-f", "/dev/null",
         "-o", "proto_version=1", "-o", f"publication_names={publication}"],
        env=os.environ | {"PGAPPNAME": name}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(100):
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
            if row is not None and row[0] is not None:
                break
            assert other.poll() is None, other.communicate()[1]
            time.sleep(0.1)
        assert row is not None
        assert row[0] is not None
        yield int(row[0])
    finally:
        other.terminate()
        other.communicate(timeout=30)
        for _ in range(100):  # the walsender lets the slot go as it exits
            with psycopg.connect(dsn) as conn:
                if conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone() == (False,):
                    break
            time.sleep(0.1)
