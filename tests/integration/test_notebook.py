"""notebooks/explore.ipynb runs top to bottom on a real lake: two pipeline runs over the shop."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import psycopg
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode

from cdc_core.launch import submit_environment
from cdc_core.sample.shop import create_schema, load_shop
from cdc_core.sample.workload import WorkloadSpec, run_workload
from tests.integration.conftest import PgServer
from tests.integration.harness import ROOT, ingest_ok, make_pipeline, sql

NOTEBOOK = ROOT / "notebooks" / "explore.ipynb"
KERNEL = "cdc-lake-test"
STATUSES = ("paid", "shipped", "delivered", "cancelled")


@pytest.fixture
def demo_lake(pg: PgServer, database: str, tmp_path: Path) -> tuple[Path, int]:
    """A lake with history: the shop snapshot, then a workload and four updates of one order.

    Returns the lake root and the id of the order updated four times (its busiest key)."""
    dsn = pg.dsn(database)
    create_schema(dsn)
    load_shop(dsn, customers=50)
    tables = ["public.customers", "public.orders", "public.order_items"]
    p = make_pipeline(tmp_path / "home", dsn, tables, snapshot="initial")
    ingest_ok(p)
    run_workload(dsn, WorkloadSpec(changes=300, seed=8))
    order = _first_order(dsn)
    sql(dsn, *(f"UPDATE orders SET status = '{s}' WHERE id = {order}" for s in STATUSES))
    ingest_ok(p)
    return Path(p.lake.root), order


def _first_order(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT min(id) FROM orders").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec that runs this Python (the project venv), found before any other."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "cdc-lake (test)", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    return KERNEL


def test_exploration_notebook_runs_top_to_bottom_on_the_demo_lake(
    demo_lake: tuple[Path, int], kernel: str
) -> None:
    lake, order = demo_lake
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=kernel,
        timeout=600,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},  # as opened in notebooks/
    )
    client.execute(env=submit_environment({"CDC_LAKE_ROOT": str(lake), "CDC_HOME": str(ROOT)}))

    text = "\n".join(_texts(notebook))
    assert f"lake:    {lake}" in text
    (events,) = _found(r"bronze: (\d+) change events", text)
    assert int(events) > 650  # the snapshot's reads and the changes after it
    for table in ("customers", "orders", "order_items"):
        (rows,) = _found(rf"silver public\.{table}: (\d+) rows", text)
        assert int(rows) > 0
    # time travel: the version before the second run had rows, and that run updated some
    (before,) = _found(r"public\.orders: (\d+) rows at version 1,", text)
    assert int(before) > 0
    (updated,) = _found(r"\d+\s+updated\s+(\d+)", text)
    assert int(updated) > 0
    changes, versions = _found(r"change data feed of public\.orders: (\d+) changes in (\d+)", text)
    assert int(changes) > 0
    assert int(versions) >= 2
    # the bronze history of the busiest key: the order updated four times
    (count,) = _found(rf'key {{"id":"{order}"}} of public\.orders: (\d+) change events', text)
    assert int(count) >= 5
    assert "status: 'shipped' -> 'delivered'" in text
    assert "same position: True" in text
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 1  # the plot of changes over time


def _texts(notebook: NotebookNode) -> list[str]:
    """Printed text and the plain-text form of displayed values, cell by cell."""
    out: list[str] = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream" and output.name == "stdout":
                out.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                out.append(output.data.get("text/plain", ""))
    return out


def _found(pattern: str, text: str) -> tuple[str, ...]:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the notebook's output:\n{text[-4000:]}"
    return match.groups()
