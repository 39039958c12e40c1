"""`snapshot.select.statement.overrides`: a table's snapshots read a SELECT of the user's instead
of the whole table. The file's key, the checks that refuse a bad one, how a planned read keeps
it, and how `cdc import-debezium` carries Debezium's two properties over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from cdc_core.snapshot import SnapshotJob, TableSnapshot
from cdc_core.snapshot_plan import Chunk, ChunkPlan
from tests.unit.test_config import CONTRACT, load_error, write_home
from tests.unit.test_debezium_import import BASE, home, pipeline_data, run, write_json

__all__ = ["home"]  # the fixture, used by name

ORDERS = TableName("public", "orders")
LIVE = "SELECT * FROM public.orders WHERE status <> 'archived'"


def with_overrides(block: str) -> str:
    return CONTRACT.replace("  mode: initial", "  mode: initial\n" + block)


def test_a_table_s_select_is_read_from_the_snapshot_section(tmp_path: Path) -> None:
    pipeline = with_overrides(
        "  select.statement.overrides:\n"
        f'    public.orders: "{LIVE};"\n'
        '    customers: "  WITH c AS (SELECT * FROM public.customers) SELECT * FROM c"\n'
    )
    snapshot = load_pipeline(
        "orders", "local", home=write_home(tmp_path, pipeline), environ={}
    ).pipeline.snapshot
    assert snapshot.select_for(ORDERS) == LIVE  # the statement's own ; is not kept
    assert snapshot.select_for(TableName("public", "customers")) == (
        "WITH c AS (SELECT * FROM public.customers) SELECT * FROM c"
    )
    assert snapshot.select_for(TableName("public", "order_items")) is None


def test_without_the_key_every_snapshot_reads_the_table(tmp_path: Path) -> None:
    snapshot = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert snapshot.pipeline.snapshot.select_for(ORDERS) is None


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ("    public.orders: DELETE FROM public.orders\n", "is not a SELECT statement"),
        ("    public.orders: status <> 'archived'\n", "is not a SELECT statement"),
        ('    "public.orders.x": SELECT 1\n', "has 3 parts: write schema.table"),
        ("    public.orderz: SELECT * FROM public.orders\n",
         "public.orderz is not captured by this pipeline"),
        ("    public.orders: SELECT 1\n    orders: SELECT 2\n",
         "public.orders has two SELECT statements"),
    ],
)  # fmt: skip
def test_a_bad_override_is_refused_naming_its_key(tmp_path: Path, block: str, said: str) -> None:
    message = load_error(tmp_path, with_overrides("  select.statement.overrides:\n" + block))
    assert "snapshot.select.statement.overrides." in message
    assert said in message


def test_a_planned_read_keeps_its_select_and_still_counts_as_whole(tmp_path: Path) -> None:
    """A job file written by one run is read by the next: the SELECT travels with the table's
    part; the part still takes the whole table's place (its sweep removes what the SELECT did
    not return), unlike a blocking signal's SELECT, which re-reads some rows only."""
    plan = ChunkPlan(
        ORDERS, ("id",), ("integer",), (Chunk(0, None, ("10",)), Chunk(1, ("10",), None)), 20
    )
    part = TableSnapshot(ORDERS, plan, ("id", "status"), override=LIVE)
    job = SnapshotJob("j1", "initial", "snapshot.mode initial", [part], 1)
    again = SnapshotJob.from_json(json.loads(json.dumps(job.to_json()))).tables[0]
    assert (again.override, again.query, again.full) == (LIVE, LIVE, True)
    signal = TableSnapshot(ORDERS, plan, ("id",), select="SELECT * FROM public.orders WHERE id < 5")
    assert (signal.query, signal.full) == (signal.select, False)
    older = part.to_json()
    del older["override"]  # a job file written before the key existed
    assert TableSnapshot.from_json(older).query is None


def test_debezium_s_list_and_statements_become_the_key(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = BASE | {
        "snapshot.select.statement.overrides": "public.orders, public.customers",
        "snapshot.select.statement.overrides.public.orders": LIVE,
        "snapshot.select.statement.overrides.public.customers": "SELECT * FROM public.customers",
        "snapshot.select.statement.overrides.public.other": "SELECT 1",
    }
    code, out, err = run(capsys, write_json(home, config))
    assert code == 0, err
    snapshot = pipeline_data(home)["snapshot"]
    assert isinstance(snapshot, dict)
    assert snapshot["select.statement.overrides"] == {
        "public.orders": LIVE, "public.customers": "SELECT * FROM public.customers",
    }  # fmt: skip
    assert "-> snapshot.select.statement.overrides" in out
    assert "snapshot.select.statement.overrides.public.other" in out  # said, not used
    loaded = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"}).pipeline
    assert loaded.snapshot.select_for(ORDERS) == LIVE


def test_a_listed_table_without_its_statement_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = BASE | {"snapshot.select.statement.overrides": "public.orders"}
    code, _, err = run(capsys, write_json(home, config))
    assert code == 2
    assert "snapshot.select.statement.overrides.public.orders" in err
    assert "missing or empty" in err
    assert not (home / "pipelines" / "shop.yaml").exists()
