"""A pipeline without `source.tables`: the tables its lists let through, found in the catalog
(Debezium's way), and the load checks left until they are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_core.config import Config, load_pipeline, with_tables
from cdc_core.errors import ConfigError
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pg.discover import CatalogTable, captured_tables, heartbeat_target
from tests.unit.test_config import CONTRACT, write_home

LISTED = "  tables: [public.customers, public.orders, public.order_items]\n"

CATALOG = [
    CatalogTable("public", "customers", "r", False),
    CatalogTable("public", "Order Items", "r", False),
    CatalogTable("public", "orders", "p", False),
    CatalogTable("public", "orders_2024", "r", True),  # a partition: its rows are orders'
    CatalogTable("public", "scratch", "r", False, "u"),  # unlogged: no WAL to decode
    CatalogTable("sales", "customers", "r", False),
    CatalogTable("pg_catalog", "pg_class", "r", False),
    CatalogTable("information_schema", "sql_features", "r", False),
    CatalogTable("pg_toast", "pg_toast_1255", "r", False),
    CatalogTable("pg_temp_3", "customers", "r", False, "t"),
    CatalogTable("pg_toast_temp_3", "customers", "r", False),
]


def source_with(lines: str) -> str:
    """The design's pipeline with `lines` under `source:` instead of its tables."""
    return CONTRACT.replace(LISTED, lines)


def load(tmp_path: Path, pipeline: str) -> Config:
    return load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})


def names(tables: list[TableName]) -> list[str]:
    return [str(t) for t in tables]


def test_tables_are_the_ones_the_include_list_matches_outside_system_schemas(
    tmp_path: Path,
) -> None:
    source = load(tmp_path, source_with("  table.include.list: .*\\.customers\n"))
    assert names(captured_tables(CATALOG, source.pipeline.source)) == [
        "public.customers", "sales.customers",
    ]  # fmt: skip


def test_lists_match_whole_names_ignoring_case_and_partitioned_tables_count_once(
    tmp_path: Path,
) -> None:
    source = load(tmp_path, source_with("  table.include.list: PUBLIC\\.ORDER.*\n"))
    assert names(captured_tables(CATALOG, source.pipeline.source)) == [
        'public."Order Items"', "public.orders",
    ]  # fmt: skip
    anchored = load(tmp_path, source_with("  table.include.list: public\\.order\n"))
    assert captured_tables(CATALOG, anchored.pipeline.source) == []


def test_a_schema_list_takes_every_table_of_it_less_the_table_exclusions(tmp_path: Path) -> None:
    pipeline = source_with("  schema.include.list: public\n  table.exclude.list: public\\.cust.*\n")
    source = load(tmp_path, pipeline).pipeline.source
    assert names(captured_tables(CATALOG, source)) == ['public."Order Items"', "public.orders"]


def test_the_signal_and_heartbeat_tables_are_left_out(tmp_path: Path) -> None:
    source = load(tmp_path, source_with("  schema.include.list: public\n"))
    own = {TableName("public", "customers"), TableName("public", "orders")}
    found = captured_tables(CATALOG, source.pipeline.source, own=own)
    assert names(found) == ['public."Order Items"']


@pytest.mark.parametrize(
    ("query", "target"),
    [
        ("INSERT INTO cdc_heartbeat (ts) VALUES (now())", "cdc_heartbeat"),
        ('  insert into ops."Heart Beat" VALUES (1)', 'ops."Heart Beat"'),
        ("UPDATE ONLY public.hb SET ts = now()", "public.hb"),
        ("SELECT 1", None),
        (None, None),
    ],
)
def test_the_heartbeat_table_is_the_one_its_query_writes(query: str | None, target: str) -> None:
    assert heartbeat_target(query) == target


def test_tables_may_be_omitted_when_an_include_list_chooses_them(tmp_path: Path) -> None:
    config = load(tmp_path, source_with("  table.include.list: public\\..*\n"))
    source = config.pipeline.source
    assert source.tables == ()
    assert source.awaits_discovery
    assert source.discovered
    assert source.tables_key == "source.table.include.list"
    found = with_tables(config, [TableName("public", "orders")])
    assert found.pipeline.source.tables == (TableName("public", "orders"),)
    assert found.pipeline.source.discovered
    assert not found.pipeline.source.awaits_discovery
    listed = load(tmp_path, CONTRACT).pipeline.source
    assert not listed.discovered
    assert listed.tables_key == "source.tables"


@pytest.mark.parametrize("lines", ["", "  table.exclude.list: public\\.x\n",
                                   "  schema.exclude.list: audit\n"])  # fmt: skip
def test_neither_tables_nor_an_include_list_is_a_configuration_error_naming_the_keys(
    tmp_path: Path, lines: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, source_with(lines))
    assert e.value.exit_code == 2
    message = str(e.value)
    assert message.startswith("pipelines/orders.yaml: source.tables: list the tables to capture")
    assert "source.table.include.list" in message
    assert "source.schema.include.list" in message
    assert "\n" not in message


def test_checks_of_keys_naming_tables_wait_for_the_discovered_tables(tmp_path: Path) -> None:
    pipeline = source_with("  table.include.list: public\\..*\n").replace(
        "  mode: initial", "  mode: initial\n  include.collection.list: public.custmers"
    )
    config = load(tmp_path, pipeline)  # loads: the tables are not known yet
    with_tables(config, [TableName("public", "custmers")])
    with pytest.raises(ConfigError) as e:
        with_tables(config, [TableName("public", "customers")])
    assert e.value.exit_code == 2
    assert str(e.value).startswith(
        "pipelines/orders.yaml: snapshot.include.collection.list: 'public.custmers' matches "
        "none of the captured tables (public.customers)"
    )


def test_discovered_names_the_lake_cannot_hold_apart_name_the_include_list(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, source_with("  table.include.list: .*\n"))
    with pytest.raises(ConfigError) as e:
        with_tables(config, [TableName("a.b", "c"), TableName("a", "b.c")])
    message = str(e.value)
    assert message.startswith("pipelines/orders.yaml: source.table.include.list: a table it lets")
    assert "are both a.b.c in bronze" in message


def test_continuous_batches_find_the_tables_again_and_check_a_changed_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_core import pipeline

    loaded = load(tmp_path, source_with("  table.include.list: public\\..*\n").replace(
        "mode: initial", "mode: always"))  # fmt: skip
    catalog = [[TableName("public", "a")], [TableName("public", "a")],
               [TableName("public", "a"), TableName("public", "b")]]  # fmt: skip
    checked: list[tuple[TableName, ...]] = []

    def found(config: Config, lake: Lake) -> Config:  # the catalog of now, none dropped
        return with_tables(config, catalog.pop(0))

    monkeypatch.setattr(pipeline.dropped, "found", found)
    lake = Lake(str(tmp_path / "lake"))
    monkeypatch.setattr(
        pipeline, "_check_source", lambda c: checked.append(c.pipeline.source.tables)
    )
    first = found(loaded, lake)
    same = pipeline._rediscovered(loaded, first, lake)
    assert checked == []  # the set the run's start checked
    assert same.pipeline.snapshot.mode == "initial"  # `always` snapshots once per run
    grown = pipeline._rediscovered(loaded, same, lake)
    assert checked == [(TableName("public", "a"), TableName("public", "b"))]
    assert grown.pipeline.source.tables == checked[0]


def test_a_dropped_table_leaves_the_tables_and_is_followed_until_applied(tmp_path: Path) -> None:
    from cdc_core.config.model import DroppedTable

    source = load(tmp_path, CONTRACT).pipeline.source
    items = TableName("public", "order_items")
    gone = DroppedTable(items, 16390, 0x3000060)
    dropped = source.with_dropped([gone])
    assert dropped.tables == (TableName("public", "customers"), TableName("public", "orders"))
    assert dropped.followed == (*dropped.tables, items)  # its last changes are read
    assert source.tables[2] == items  # the loaded source stays as it was
    done = DroppedTable(items, 16390, 0x3000060, applied=True)
    assert source.with_dropped([done]).followed == dropped.tables  # applied: no longer read
    assert DroppedTable.from_json(items, json.loads(json.dumps(gone.to_json()))) == gone
