"""The shop sample on a real PostgreSQL: schema, bulk load, and the workload's changes."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_core.sample.shop import (
    ShopCounts,
    create_schema,
    ensure_database,
    load_shop,
    table_counts,
)
from cdc_core.sample.workload import WorkloadSpec, WorkloadStats, run_workload
from tests.integration.conftest import PgServer

MakeShop = Callable[..., str]
KEYS = {"customers": ("id",), "orders": ("id",), "order_items": ("order_id", "line_no")}


@pytest.fixture
def make_shop(pg: PgServer) -> Iterator[MakeShop]:
    """Creates uniquely named shop databases (loaded with 200 customers unless `load=False`)
    and drops them, with any slot in them, after the test."""
    created: list[str] = []

    def make(*, load: bool = True, seed: int = 7) -> str:
        created.append(f"shop_{uuid.uuid4().hex[:8]}")
        dsn = ensure_database(pg.dsn(), created[-1])
        create_schema(dsn)
        if load:
            load_shop(dsn, customers=200, seed=seed)
        return dsn

    yield make
    for name in created:
        pg.drop_database(name)


def scalar(dsn: str, query: str | sql.Composable, params: tuple[object, ...] = ()) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def digest(dsn: str, table: str) -> str:
    """md5 of the whole table's rows as text, in key order."""
    keys = sql.SQL(", ").join(map(sql.Identifier, KEYS[table]))
    query = sql.SQL(
        "SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY {}), '')) FROM {} AS t"
    ).format(keys, sql.Identifier("public", table))
    return str(scalar(dsn, query))


def digests(dsn: str) -> dict[str, str]:
    return {t: digest(dsn, t) for t in KEYS}


def small_run(dsn: str, **spec: object) -> WorkloadStats:
    return run_workload(dsn, WorkloadSpec(**{"changes": 2000, **spec}))  # type: ignore[arg-type]


# --- schema and load ------------------------------------------------------------------------


def test_ensure_database_is_idempotent_and_points_at_the_new_database(
    pg: PgServer, make_shop: MakeShop
) -> None:
    dsn = make_shop(load=False)
    name = str(scalar(dsn, "SELECT current_database()"))
    assert ensure_database(pg.dsn(), name) == dsn
    create_schema(dsn)  # a second time changes nothing
    assert table_counts(dsn) == ShopCounts(0, 0, 0)


def test_a_role_without_superuser_can_create_load_and_change_its_shop(pg: PgServer) -> None:
    role, dbname = f"shop_owner_{uuid.uuid4().hex[:8]}", f"shop_{uuid.uuid4().hex[:8]}"
    pg_admin = pg.dsn()
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD 'shop'").format(
            sql.Identifier(role)))  # fmt: skip
    try:
        owner = make_conninfo(pg_admin, user=role, password="shop")
        dsn = ensure_database(owner, dbname)
        create_schema(dsn)
        load_shop(dsn, customers=50)
        stats = small_run(dsn, changes=300)
        assert stats.transactions_committed > 0
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(dbname)))  # fmt: skip
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_load_reports_the_rows_it_wrote(make_shop: MakeShop) -> None:
    dsn = make_shop(load=False)
    counts = load_shop(dsn, customers=50, orders_per_customer=4, items_per_order=2)
    assert counts == ShopCounts(customers=50, orders=200, order_items=400)
    assert table_counts(dsn) == counts


def test_loading_again_appends_after_the_existing_ids(make_shop: MakeShop) -> None:
    dsn = make_shop()
    load_shop(dsn, customers=10, seed=8)
    assert table_counts(dsn) == ShopCounts(210, 630, 1890)
    assert scalar(dsn, "SELECT max(id) FROM customers") == 210


def test_the_same_load_seed_gives_the_same_rows(make_shop: MakeShop) -> None:
    assert digests(make_shop(seed=3)) == digests(make_shop(seed=3))


def test_big_notes_are_stored_out_of_line_in_the_toast_table(make_shop: MakeShop) -> None:
    dsn = make_shop()
    toast = scalar(
        dsn, "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'customers'"
    )
    chunks = sql.SQL("SELECT count(DISTINCT chunk_id) FROM {}")
    toasted_values = scalar(dsn, chunks.format(sql.Identifier(*str(toast).split("."))))
    big_notes = scalar(dsn, "SELECT count(*) FROM customers WHERE octet_length(notes) > 8000")
    assert 10 <= int(str(big_notes)) <= 40  # ~10% of 200
    assert toasted_values == big_notes


def test_loaded_rows_mix_nulls_unicode_nested_json_and_tags(make_shop: MakeShop) -> None:
    dsn = make_shop()
    nullable = ("tags", "profile", "balance", "birth_date", "notes", "external_id")
    nulls = sql.SQL("SELECT array[{}] FROM customers").format(
        sql.SQL(", ").join(
            sql.SQL("count(*) - count({})").format(sql.Identifier(c)) for c in nullable
        )
    )
    assert 0 not in scalar(dsn, nulls)  # type: ignore[operator]
    non_ascii = "SELECT count(*) FROM customers WHERE full_name !~ '^[[:ascii:]]*$'"
    assert scalar(dsn, non_ascii) != 0
    tags = "SELECT array[min(cardinality(tags)), max(cardinality(tags))] FROM customers"
    assert scalar(dsn, tags) == [0, 4]
    nested = "SELECT count(*) FROM orders WHERE shipping #>> '{address,city}' = '東京'"
    assert scalar(dsn, nested) != 0
    assert scalar(dsn, "SELECT count(DISTINCT status) FROM orders") == 5
    years = "SELECT count(DISTINCT date_trunc('year', placed_at)) FROM orders"
    assert scalar(dsn, years) == 6


# --- workload -------------------------------------------------------------------------------


def test_workload_stats_add_up_to_the_table_counts(make_shop: MakeShop) -> None:
    dsn = make_shop()
    before = table_counts(dsn)
    stats = small_run(dsn)
    after = table_counts(dsn)
    for table in KEYS:
        s = stats.per_table[table]
        assert getattr(after, table) == getattr(before, table) + s.inserts - s.deletes, table
    parts = stats.inserts + stats.updates + stats.deletes + stats.pk_changes
    assert stats.rows_changed_committed == parts
    assert stats.rows_changed_committed + stats.rows_changed_rolled_back >= 2000
    assert min(stats.inserts, stats.updates, stats.deletes, stats.pk_changes) > 0
    assert stats.transactions_rolled_back > 0
    assert stats.transactions_failed == 0


def test_rolled_back_transactions_leave_no_trace(make_shop: MakeShop) -> None:
    dsn = make_shop()
    before = digests(dsn)
    stats = small_run(dsn, changes=600, rollback_fraction=1.0)
    assert stats.transactions_committed == 0
    assert stats.rows_changed_rolled_back >= 600
    assert digests(dsn) == before


def test_the_same_seed_on_the_same_data_gives_the_same_tables(make_shop: MakeShop) -> None:
    first, second, third = make_shop(), make_shop(), make_shop()
    small_run(first, seed=11)
    small_run(second, seed=11)
    small_run(third, seed=12)
    assert digests(first) == digests(second)
    assert digests(first) != digests(third)


def test_identity_defaults_do_not_collide_after_load_and_workload(make_shop: MakeShop) -> None:
    dsn = make_shop()
    small_run(dsn, changes=500, mix={"insert": 1.0, "pk_change": 1.0})
    with psycopg.connect(dsn) as conn:
        top = conn.execute("SELECT max(id) FROM orders").fetchone()
        new = conn.execute(
            "INSERT INTO orders (customer_id, status, total, currency, placed_at, ref)"
            " VALUES (1, 'paid', 1, 'EUR', now(), gen_random_uuid()) RETURNING id"
        ).fetchone()
    assert top is not None
    assert new is not None
    assert new[0] > top[0]


def start_capture(dsn: str) -> None:
    """A pgoutput slot on the shop tables, so a test can read back what the workload wrote."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION shop_pub FOR TABLE customers, orders, order_items")
        conn.execute("SELECT pg_create_logical_replication_slot('shop_slot', 'pgoutput')")


def captured(dsn: str) -> list[tuple[int, bytes]]:
    """(LSN, pgoutput message) of everything committed since `start_capture`."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_binary_changes("
            "'shop_slot', NULL, NULL, 'proto_version', '1', 'publication_names', 'shop_pub')"
        ).fetchall()
    return [(int(lsn), bytes(data)) for lsn, data in rows]


def column_kinds(update: bytes) -> bytes:
    """The column kinds (n null, u unchanged TOAST, t text) of an Update's new tuple."""
    assert update[:1] == b"U"
    pos = 5
    if update[pos : pos + 1] in (b"K", b"O"):
        raise AssertionError("old tuple not expected: the updates leave the key alone")
    ncols, pos, kinds = int.from_bytes(update[pos + 1 : pos + 3], "big"), pos + 3, b""
    for _ in range(ncols):
        kind = update[pos : pos + 1]
        kinds, pos = kinds + kind, pos + 1
        if kind in (b"t", b"b"):
            pos += 4 + int.from_bytes(update[pos : pos + 4], "big")
    return kinds


def test_toast_untouched_updates_mostly_hit_toasted_rows_and_keep_their_notes(
    make_shop: MakeShop,
) -> None:
    dsn = make_shop()
    notes = "SELECT md5(string_agg(id || ':' || md5(coalesce(notes, '-')), ',' ORDER BY id))"
    notes += " FROM customers"
    notes_before = scalar(dsn, notes)
    start_capture(dsn)
    stats = small_run(dsn, changes=300, mix={"toast_untouched_update": 1.0})
    updates = [column_kinds(m) for _, m in captured(dsn) if m[:1] == b"U"]
    assert scalar(dsn, notes) == notes_before
    assert len(updates) == stats.updates
    assert sum(b"u" in kinds for kinds in updates) > 0.7 * len(updates)  # ~10% of rows have one


def test_transactions_overlap_so_a_later_commit_holds_lower_lsns(make_shop: MakeShop) -> None:
    dsn = make_shop()
    start_capture(dsn)
    stats = small_run(dsn, changes=500, concurrency=3)
    txns: list[list[int]] = []
    for lsn, message in captured(dsn):
        if message[:1] == b"B":
            txns.append([])
        elif message[:1] in (b"I", b"U", b"D"):
            txns[-1].append(lsn)
    txns = [t for t in txns if t]
    assert len(txns) == stats.transactions_committed
    overtaken = [i for i in range(1, len(txns)) if min(txns[i]) < max(txns[i - 1])]
    assert len(overtaken) > len(txns) // 4


def test_setting_stop_ends_the_run_and_closes_every_connection(make_shop: MakeShop) -> None:
    dsn = make_shop()
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    stats = run_workload(dsn, WorkloadSpec(duration_s=120, rate=300), stop=stop)
    assert time.monotonic() - started < 10
    assert stats.transactions_committed > 0
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'shop-workload%%'"
    deadline = time.monotonic() + 5
    while scalar(dsn, query) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # a backend leaves pg_stat_activity shortly after its client closes
    assert scalar(dsn, query) == 0


def test_the_rate_is_tracked_on_average(make_shop: MakeShop) -> None:
    dsn = make_shop()
    stats = run_workload(dsn, WorkloadSpec(duration_s=3, rate=400))
    assert 320 < stats.rows_per_second < 480
