"""The `shop` sample database: create it, create its schema and bulk-load deterministic rows.

The demo, the integration tests and the benchmarks all start from here; `workload.py` then
changes the rows. Row builders are public so the workload inserts rows of the same shape.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from importlib import resources
from typing import Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

SCHEMA = "public"
TABLES = ("customers", "orders", "order_items")
CUSTOMER_COLUMNS = ("id", "email", "full_name", "tier", "tags", "profile", "balance",
                    "created_at", "birth_date", "notes", "external_id")  # fmt: skip
ORDER_COLUMNS = ("id", "customer_id", "status", "total", "currency", "placed_at", "shipping",
                 "discount_rate", "weight_kg", "is_gift", "ref")  # fmt: skip
ITEM_COLUMNS = ("order_id", "line_no", "sku", "qty", "unit_price", "attributes", "note")

TIERS = ("bronze", "silver", "gold", "platinum")
STATUSES = ("pending", "paid", "shipped", "delivered", "cancelled")
CURRENCIES = ("EUR", "USD", "GBP", "JPY", "CHF", "SEK")
CITIES = ("東京", "München", "São Paulo", "Zürich", "Kraków", "Reykjavík", "New York",
          "Paris", "Montréal", "Αθήνα", "Cape Town", "Québec")  # fmt: skip
TAGS = ("vip", "newsletter", "b2b", "returning", "late-payer", "wholesale", "beta", "éco")
BIG_NOTES_MIN_BYTES = 9000  # above the ~2 KB TOAST threshold even before compression is tried

_FIRST = ("Zoë", "José", "Ana", "Liam", "Søren", "Mia", "Noah", "Chloé", "Yuki", "Ömer",
          "Björn", "Олег", "Fatima", "Li", "Émile", "Ngozi", "Aoife", "Zoltán")  # fmt: skip
_LAST = ("Müller", "Núñez", "Smith", "O'Brien", "Tanaka", "Dvořák", "Kowalski", "García",
         "Øverby", "Ng", "Иванов", "山田", "Svensson", "Nguyễn", "Okafor")  # fmt: skip
_WORDS = ("fragile", "deliver after 5pm", "call first", "東京 office", "gift wrap ✓",
          "leave at door", "Zoë's order", "no plastic", "rush", "Straße 12")  # fmt: skip
_CARRIERS = ("dhl", "ups", "fedex", "post", "pickup")
_COLORS = ("red", "blue", "black", "white", "grün", "青")
_EPOCH = datetime(2019, 1, 1, tzinfo=timezone.utc)
_SPAN_S = 6 * 365 * 86400
_JSON_POOL_SIZE = 4096

JsonKind = Literal["profile", "shipping", "attributes"]


@dataclass(frozen=True)
class ShopCounts:
    """Row counts of the three shop tables."""

    customers: int
    orders: int
    order_items: int


def ensure_database(admin_conninfo: str, dbname: str = "shop") -> str:
    """Create database `dbname` if missing; return a conninfo for it (same host, port, user).

    `admin_conninfo` points at any database on the server, as a role allowed to create one.
    """
    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if found is None:
            # created concurrently by another caller: that is the wanted end state
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return make_conninfo(admin_conninfo, dbname=dbname)


def create_schema(conninfo: str) -> None:
    """Create the enum types and the three tables if missing (idempotent)."""
    ddl = resources.files("cdc_core.sample").joinpath("shop.sql").read_text(encoding="utf-8")
    with psycopg.connect(conninfo) as conn:
        conn.execute(ddl.encode())  # bytes: run as one multi-statement simple query


def load_shop(
    conninfo: str,
    *,
    customers: int = 1000,
    orders_per_customer: int = 3,
    items_per_order: int = 3,
    seed: int = 7,
    big_notes_fraction: float = 0.1,
) -> ShopCounts:
    """Append deterministic rows with COPY and return how many were loaded per table.

    Ids continue after the largest existing ones, so loading twice appends; every order gets
    exactly `items_per_order` lines. Identity sequences are moved past the loaded ids and the
    tables analyzed, so inserts that use the column default do not collide.
    """
    n_orders = customers * orders_per_customer
    with psycopg.connect(conninfo) as conn:
        customer_ids = _new_ids(conn, "customers", customers)
        order_ids = _new_ids(conn, "orders", n_orders)
        rng = random.Random(f"{seed}:customers")
        rows: Iterable[Sequence[object]]
        rows = (customer_row(rng, i, big_notes_fraction=big_notes_fraction) for i in customer_ids)
        copy_rows(conn, "customers", CUSTOMER_COLUMNS, rows)
        rng = random.Random(f"{seed}:orders")
        rows = (order_row(rng, i, _pick(rng, customer_ids)) for i in order_ids)
        copy_rows(conn, "orders", ORDER_COLUMNS, rows)
        rng = random.Random(f"{seed}:order_items")
        rows = (item_row(rng, o, n) for o in order_ids for n in range(1, items_per_order + 1))
        copy_rows(conn, "order_items", ITEM_COLUMNS, rows)
        for table in ("customers", "orders"):
            advance_identity(conn, table, 0)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(_tables_list()))
    return ShopCounts(customers, n_orders, n_orders * items_per_order)


def table_counts(conninfo: str) -> ShopCounts:
    """Current row counts of the three tables."""
    query = sql.SQL("SELECT {}").format(
        sql.SQL(", ").join(
            sql.SQL("(SELECT count(*) FROM {})").format(sql.Identifier(SCHEMA, t)) for t in TABLES
        )
    )
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return ShopCounts(*(int(n) for n in row))


def next_free_id(conn: psycopg.Connection[tuple[object, ...]], table: str) -> int:
    """One more than the largest `id` in `table` (1 when empty)."""
    query = sql.SQL("SELECT coalesce(max(id), 0) + 1 FROM {}").format(sql.Identifier(SCHEMA, table))
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(str(row[0]))


def advance_identity(conn: psycopg.Connection[tuple[object, ...]], table: str, past: int) -> None:
    """Make the `id` identity of `table` hand out values above `past`, the stored ids and its
    own last value; it never moves back, so ids handed out earlier are not reused."""
    query = sql.SQL(
        "SELECT setval(s, greatest(%s, coalesce(pg_sequence_last_value(s), 0),"
        " (SELECT coalesce(max(id), 0) FROM {table})) + 1, false)"
        " FROM (SELECT pg_get_serial_sequence(%s, 'id')::regclass AS s) AS q"
    ).format(table=sql.Identifier(SCHEMA, table))
    conn.execute(query, (past, sql.Identifier(SCHEMA, table).as_string(conn)))


def copy_rows(
    conn: psycopg.Connection[tuple[object, ...]],
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
) -> int:
    """COPY `rows` into `table`; returns how many were written."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(SCHEMA, table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    n = 0
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)
            n += 1
    return n


def customer_row(
    rng: random.Random, id_: int, *, big_notes_fraction: float = 0.1
) -> tuple[object, ...]:
    """A customers row in `CUSTOMER_COLUMNS` order; ~`big_notes_fraction` get TOASTed notes."""
    r = rng.random
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    return (
        id_,
        f"{first.lower()}.{last.lower()}.{id_}@example.com",
        f"{first} {last}",
        TIERS[int(r() ** 2 * 4)],  # most customers are bronze
        None if r() < 0.2 else rng.sample(TAGS, int(r() * 5)),
        None if r() < 0.15 else _pick_json(rng, "profile"),
        None if r() < 0.1 else money(rng, -50_000, 2_000_000),
        timestamp(rng),
        None if r() < 0.25 else date(1950, 1, 1) + timedelta(days=int(r() * 20_000)),
        notes_text(rng, big=r() < big_notes_fraction),
        None if r() < 0.3 else uuid.UUID(int=rng.getrandbits(128), version=4),
    )


def order_row(rng: random.Random, id_: int, customer_id: int) -> tuple[object, ...]:
    """An orders row in `ORDER_COLUMNS` order."""
    r = rng.random
    return (
        id_,
        customer_id,
        STATUSES[int(r() * 5)],
        money(rng, 100, 5_000_000),
        CURRENCIES[int(r() * 6)],
        timestamp(rng),
        None if r() < 0.1 else _pick_json(rng, "shipping"),
        None if r() < 0.6 else round(r() * 0.5, 3),
        None if r() < 0.2 else r() * 40,
        r() < 0.1,
        uuid.UUID(int=rng.getrandbits(128), version=4),
    )


def item_row(rng: random.Random, order_id: int, line_no: int) -> tuple[object, ...]:
    """An order_items row in `ITEM_COLUMNS` order."""
    r = rng.random
    return (
        order_id,
        line_no,
        f"SKU-{int(r() * 100_000):05d}",
        1 + int(r() * 10),
        money(rng, 50, 500_000),
        None if r() < 0.3 else _pick_json(rng, "attributes"),
        None if r() < 0.7 else _WORDS[int(r() * len(_WORDS))],
    )


def money(rng: random.Random, lo_cents: int, hi_cents: int) -> Decimal:
    return Decimal(lo_cents + int(rng.random() * (hi_cents - lo_cents))).scaleb(-2)


def timestamp(rng: random.Random) -> datetime:
    """A microsecond-precision UTC instant in 2019..2024."""
    return _EPOCH + timedelta(microseconds=int(rng.random() * _SPAN_S * 1_000_000))


def notes_text(rng: random.Random, *, big: bool) -> str | None:
    """Short unicode notes or NULL; `big` gives > 8 KB of random hex that pglz cannot shrink
    enough to keep inline, so the value is stored out of line in the TOAST table."""
    if big:
        size = BIG_NOTES_MIN_BYTES + int(rng.random() * 4000)
        return f"Zoë — 東京 notes: {rng.randbytes(size // 2).hex()}"
    return None if rng.random() < 0.5 else " · ".join(rng.sample(_WORDS, 1 + int(rng.random() * 3)))


def shipping_doc(rng: random.Random) -> dict[str, object]:
    r = rng.random
    return {
        "carrier": _CARRIERS[int(r() * 5)],
        "address": {"city": CITIES[int(r() * len(CITIES))], "zip": f"{int(r() * 99999):05d}",
                    "lines": [f"{int(r() * 300)} Main St", "Apt. ✦ 4"][: 1 + int(r() * 2)]},
        "tracking": None if r() < 0.3 else f"TRK{rng.getrandbits(40):012X}",
        "parcels": [{"kg": round(r() * 20, 2)} for _ in range(int(r() * 3))],
    }  # fmt: skip


def attributes_doc(rng: random.Random) -> dict[str, object]:
    r = rng.random
    return {"color": _COLORS[int(r() * 6)], "size": int(r() * 50),
            "dims": {"w": round(r() * 90, 1), "h": round(r() * 90, 1)}}  # fmt: skip


def profile_doc(rng: random.Random) -> dict[str, object]:
    r = rng.random
    return {
        "lang": ("en", "de", "ja", "fr", "pt-BR")[int(r() * 5)],
        "newsletter": r() < 0.5,
        "address": {"city": CITIES[int(r() * len(CITIES))], "country": "🌍"},
        "scores": [round(r() * 5, 2) for _ in range(int(r() * 4))],
        "referrer": None,
    }


@functools.cache
def _json_pool(kind: JsonKind) -> tuple[str, ...]:
    """Serialized documents to draw from: serializing one per row would halve the load rate."""
    build = {"profile": profile_doc, "shipping": shipping_doc, "attributes": attributes_doc}[kind]
    rng = random.Random(f"json:{kind}")
    return tuple(json.dumps(build(rng), ensure_ascii=False) for _ in range(_JSON_POOL_SIZE))


def _pick_json(rng: random.Random, kind: JsonKind) -> str:
    pool = _json_pool(kind)
    return pool[int(rng.random() * len(pool))]


def _new_ids(conn: psycopg.Connection[tuple[object, ...]], table: str, n: int) -> range:
    first = next_free_id(conn, table)
    return range(first, first + n)


def _pick(rng: random.Random, ids: range) -> int:
    return ids.start + int(rng.random() * len(ids))


def _tables_list() -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(SCHEMA, t) for t in TABLES)
