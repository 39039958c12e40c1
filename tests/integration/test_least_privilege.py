"""Least privilege: the product runs with only the grants README.md ("Permissions") lists, and
its password appears nowhere: not in the lake (state, staging, Delta logs and data, metrics),
not in what the commands print, not in the errors of a connection that fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_core.pg.local import free_port
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, Pipeline, make_pipeline, sql
from tests.integration.privileges import (
    PASSWORD,
    PASSWORD_VAR,
    PRODUCT_ROLE,
    files_holding_password,
)


def cdc(p: Pipeline, *args: str, env: dict[str, str] | None = None) -> str:
    """A `cdc` command as users run it; what it printed on stdout and stderr."""
    run = subprocess.run(
        [sys.executable, "-m", "cdc_core.cli", *args, "--pipeline", "p"],
        env=(env or p.env()) | {"PYTHONPATH": str(ROOT)}, cwd=p.home, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    return run.stdout + run.stderr


@pytest.fixture
def items(pg: PgServer, database: str, tmp_path: Path) -> Pipeline:
    """A pipeline of one table, with a heartbeat so the stream carries a message too."""
    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
        "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 200) g")  # fmt: skip
    return make_pipeline(tmp_path, dsn, ["public.items"], snapshot="initial",
                         source_extra="heartbeat.interval.ms: 1\n")  # fmt: skip


def test_a_pipeline_run_as_the_least_privilege_role_never_shows_its_password(
    pg: PgServer, items: Pipeline
) -> None:
    p, dsn = items, items.dsn
    pipeline_file = (p.home / "pipelines" / "p.yaml").read_text()
    assert f"user={PRODUCT_ROLE}" in pipeline_file
    assert f"password=${{{PASSWORD_VAR}}}" in pipeline_file
    assert PASSWORD not in pipeline_file

    output = []
    # the snapshot's JDBC reads, the stream, a heartbeat: all as the role; a child, whose
    # output is the whole process's (its JVM's too)
    first = p.ingest(child=True)
    output.append(first.stdout + first.stderr)
    assert first.returncode == 0, first.stderr[-3000:]
    with psycopg.connect(dsn) as conn:
        owner = conn.execute(
            "SELECT pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = %s",
            (f"pub_{p.slot}",),
        ).fetchone()
    assert owner == (PRODUCT_ROLE,), "the product created its publication as its own role"

    sql(dsn, "UPDATE items SET v = 'changed' WHERE id <= 20", "DELETE FROM items WHERE id > 190")
    captured = p.ingest("--capture-only")  # streamed changes staged, no Spark
    output.append(captured.stdout + captured.stderr)
    assert captured.returncode == 0, captured.stderr[-3000:]
    output.append(cdc(p, "status", "--json"))
    output.append(cdc(p, "doctor"))

    wrong = p.env() | {PASSWORD_VAR: f"wrong-{PASSWORD}"}  # refused by the server
    output.append(cdc(p, "doctor", env=wrong))
    output.append(cdc(p, "status", env=wrong))
    p.edit(f"port={conninfo_to_dict(dsn)['port']}", f"port={free_port()}")  # nothing listens
    unreachable = p.ingest("--capture-only")
    output.append(unreachable.stdout + unreachable.stderr)
    assert unreachable.returncode == 75, unreachable.stderr[-2000:]
    output.append(cdc(p, "doctor"))
    output.append(cdc(p, "status"))

    printed = "\n".join(output)
    if pg.cluster is not None:  # the tests' own server asks the role for its password
        assert "password authentication failed" in printed  # so the wrong one was tried
    assert "cannot connect to PostgreSQL" in printed
    assert PASSWORD not in printed
    lake = p.home / "lake"
    for made in ("_state/batches.jsonl", "_state/metrics.prom", "bronze/_delta_log", "_staging"):
        assert (lake / made).exists(), f"{made} was not written: the search below proves less"
    assert files_holding_password(lake) == []  # validate's files: see test_validate.py
