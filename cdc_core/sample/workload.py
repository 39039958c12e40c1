"""Deterministic OLTP traffic on the shop tables: the source changes the CDC tests capture.

`concurrency` connections, driven from one thread, each hold an open transaction; statements
are issued round-robin, so transactions overlap and a later commit can hold lower LSNs. The
plan comes from `workload_plan` (seed only); this module runs it: the SQL of each step, the
interleaving, pacing, stopping and the tally.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import psycopg
from psycopg import sql

from cdc_core.sample import shop
from cdc_core.sample.workload_plan import (
    DEFAULT_MIX,
    OP_KINDS,
    KeySpace,
    Op,
    OpKind,
    TxnPlan,
    WorkloadSpec,
    plan_transaction,
)

__all__ = ["DEFAULT_MIX", "OP_KINDS", "OpKind", "TableStats", "WorkloadSpec", "WorkloadStats",
           "run_workload"]  # fmt: skip

Category = Literal["inserts", "updates", "deletes", "pk_changes"]

LOCK_TIMEOUT = "5s"  # a safety net: our own transactions never wait for each other
ID_RESERVE = 100_000  # identity sequences are kept this far ahead of the ids we hand out
_GIVE_UP_ERRORS = (
    psycopg.errors.LockNotAvailable,
    psycopg.errors.QueryCanceled,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)


@dataclass(frozen=True)
class TableStats:
    """Committed row changes of one table; a key change counts in `pk_changes` only."""

    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    pk_changes: int = 0


@dataclass(frozen=True)
class WorkloadStats:
    """What a run did. Row counts by kind cover committed work only."""

    transactions_committed: int
    transactions_rolled_back: int
    """Planned rollbacks plus transactions given up on an error such as a lock timeout."""
    transactions_failed: int
    inserts: int
    updates: int
    deletes: int
    pk_changes: int
    rows_changed_committed: int
    rows_changed_rolled_back: int
    seconds: float
    per_table: Mapping[str, TableStats]

    @property
    def rows_per_second(self) -> float:
        total = self.rows_changed_committed + self.rows_changed_rolled_back
        return total / self.seconds if self.seconds > 0 else 0.0


def run_workload(
    conninfo: str, spec: WorkloadSpec, *, stop: threading.Event | None = None
) -> WorkloadStats:
    """Run `spec` against the shop tables at `conninfo` and report what was done.

    Setting `stop` (or reaching the spec's limit) starts no new transaction; open ones finish
    as planned, then every connection is closed. A lock timeout or deadlock gives up only the
    transaction it hit; losing the server raises.
    """
    stop = stop if stop is not None else threading.Event()
    control = psycopg.connect(conninfo, autocommit=True, application_name="shop-workload")
    slots: list[_Slot] = []
    try:
        keys = KeySpace({t: _bounds(control, t) for t in ("customers", "orders")}, spec.concurrency)
        for i in range(spec.concurrency):
            slots.append(_Slot(conninfo, i, spec.concurrency))
        return _Driver(spec, keys, slots, control, stop).run()
    finally:
        for s in slots:
            s.conn.close()  # closing a connection rolls back what is still open
        control.close()


class _Slot:
    """One connection and the transaction it has open."""

    def __init__(self, conninfo: str, slot: int, slots: int) -> None:
        self.conn = psycopg.connect(conninfo, application_name=f"shop-workload-{slot}")
        self.conn.execute(sql.SQL("SET lock_timeout = {}").format(LOCK_TIMEOUT))
        self.conn.commit()
        self.cursor = self.conn.cursor()
        self.index = slot
        self.params: dict[str, object] = {"slot": slot, "slots": slots}
        self.plan: TxnPlan | None = None
        self.step = 0
        self.pending: Counter[tuple[str, Category]] = Counter()


class _Driver:
    """The single-threaded loop that interleaves the slots' transactions."""

    def __init__(
        self,
        spec: WorkloadSpec,
        keys: KeySpace,
        slots: list[_Slot],
        control: psycopg.Connection[tuple[object, ...]],
        stop: threading.Event,
    ) -> None:
        self.spec, self.keys, self.slots, self.control, self.stop = spec, keys, slots, control, stop
        self.rng = random.Random(spec.seed)
        self.reserved: dict[str, int] = {}
        self.committed: Counter[tuple[str, Category]] = Counter()
        self.txns: Counter[str] = Counter()
        self.progress = 0  # rows changed in any transaction, >= 1 per statement
        self.rows_rolled_back = 0
        self.started = time.monotonic()
        self.paced_from = self.started  # moves forward when a stall is forgiven

    def run(self) -> WorkloadStats:
        while True:
            accepting = not self.stop.is_set() and not self._limit_reached()
            busy = False
            for slot in self.slots:
                if slot.plan is None and accepting:
                    self._begin(slot)
                if slot.plan is not None:
                    busy = True
                    self._turn(slot)
                    self._pace()
            if not busy:
                return self._stats()

    def _limit_reached(self) -> bool:
        spec, elapsed = self.spec, time.monotonic() - self.started
        return (spec.changes is not None and self.progress >= spec.changes) or (
            spec.duration_s is not None and elapsed >= spec.duration_s
        )

    def _begin(self, slot: _Slot) -> None:
        slot.plan = plan_transaction(self.rng, self.spec, self.keys, slot.index)
        slot.step = 0
        for table in ("customers", "orders"):
            if self.keys.top(table) >= self.reserved.get(table, 0):
                self.reserved[table] = self.keys.top(table) + ID_RESERVE
                shop.advance_identity(self.control, table, self.reserved[table])

    def _turn(self, slot: _Slot) -> None:
        """One statement of the slot's transaction, or its COMMIT / ROLLBACK."""
        assert slot.plan is not None
        if slot.step == len(slot.plan.ops):
            self._finish(slot, commit=slot.plan.commit)
            return
        op = slot.plan.ops[slot.step]
        slot.step += 1
        try:
            changed = _EXECUTORS[op.variant](slot.cursor, op, slot.params)
        except _GIVE_UP_ERRORS:
            self.progress += 1
            self.txns["failed"] += 1
            self._finish(slot, commit=False)
            return
        slot.pending.update(changed)
        self.progress += max(1, sum(changed.values()))

    def _finish(self, slot: _Slot, *, commit: bool) -> None:
        if commit:
            slot.conn.commit()
            self.committed.update(slot.pending)
        else:
            slot.conn.rollback()
            self.rows_rolled_back += sum(slot.pending.values())
        self.txns["committed" if commit else "rolled_back"] += 1
        slot.plan, slot.pending = None, Counter()

    def _pace(self) -> None:
        """Sleep until the rows done so far match the target rate; at most one second of
        backlog is caught up in a burst, so a stall does not turn into a long spike."""
        if self.spec.rate is None or self.stop.is_set():
            return
        due = self.paced_from + self.progress / self.spec.rate
        now = time.monotonic()
        if due > now:
            self.stop.wait(due - now)
        elif now - due > 1.0:
            self.paced_from += now - due - 1.0

    def _stats(self) -> WorkloadStats:
        per_table = {
            t: TableStats(**{c: self.committed[(t, c)] for c in _CATEGORIES}) for t in shop.TABLES
        }
        totals = {c: sum(getattr(s, c) for s in per_table.values()) for c in _CATEGORIES}
        return WorkloadStats(
            transactions_committed=self.txns["committed"],
            transactions_rolled_back=self.txns["rolled_back"],
            transactions_failed=self.txns["failed"],
            rows_changed_committed=sum(self.committed.values()),
            rows_changed_rolled_back=self.rows_rolled_back,
            seconds=time.monotonic() - self.started,
            per_table=MappingProxyType(per_table),
            **totals,
        )


def _bounds(conn: psycopg.Connection[tuple[object, ...]], table: str) -> tuple[int, int]:
    query = sql.SQL("SELECT coalesce(min(id), 1), coalesce(max(id), 0) FROM {}")
    row = conn.execute(query.format(sql.Identifier(shop.SCHEMA, table))).fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


# --- statements ---------------------------------------------------------------------------
# Every statement changes rows of the slot's share only: `pick` finds the first row of the
# share at or after %(at)s, else the share's first row, so it never waits on another slot.

_CATEGORIES: tuple[Category, ...] = ("inserts", "updates", "deletes", "pk_changes")
_KEYS = {"customers": ("id",), "orders": ("id",), "order_items": ("order_id", "line_no")}
Changes = Counter[tuple[str, Category]]
Cursor = psycopg.Cursor[tuple[object, ...]]
Executor = Callable[[Cursor, Op, dict[str, object]], Changes]
Values = Callable[[random.Random], dict[str, object]]


def _table(name: str) -> sql.Identifier:
    return sql.Identifier(shop.SCHEMA, name)


def _pick(table: str, prefer: str = "") -> sql.Composed:
    """Keys of one row of the slot's share; `prefer` favours matching rows close to %(at)s."""
    keys = sql.SQL(", ").join(map(sql.Identifier, _KEYS[table]))
    lead = sql.Identifier(_KEYS[table][0])
    branch = sql.SQL(
        "(SELECT {keys} FROM {t} WHERE {lead} %% %(slots)s = %(slot)s{cond}"
        " ORDER BY {keys} LIMIT 1)"
    )
    near = sql.SQL(" AND {lead} >= %(at)s").format(lead=lead)
    conds = [near, sql.SQL("")]
    if prefer:
        window = sql.SQL(" AND {lead} < %(at)s + 5000 AND ").format(lead=lead) + sql.SQL(prefer)
        conds.insert(0, near + window)
    branches = [branch.format(keys=keys, t=_table(table), lead=lead, cond=c) for c in conds]
    return sql.SQL(" UNION ALL ").join(branches) + sql.SQL(" LIMIT 1")


def _match(table: str) -> sql.Composed:
    keys = _KEYS[table]
    return sql.SQL("({}) = ({})").format(
        sql.SQL(", ").join(sql.Identifier("t", k) for k in keys),
        sql.SQL(", ").join(sql.Identifier("pick", k) for k in keys),
    )


def _update(table: str, assignments: str, values: Values, *, prefer: str = "") -> Executor:
    statement = sql.SQL("WITH pick AS ({}) UPDATE {} AS t SET {} FROM pick WHERE {}").format(
        _pick(table, prefer), _table(table), sql.SQL(assignments), _match(table)
    )

    def run(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
        cur.execute(statement, {**params, "at": op.at, **values(random.Random(op.seed))})
        return Counter({(table, "updates"): cur.rowcount})

    return run


def _delete(table: str) -> Executor:
    statement = sql.SQL("WITH pick AS ({}) DELETE FROM {} AS t USING pick WHERE {}").format(
        _pick(table), _table(table), _match(table)
    )

    def run(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
        cur.execute(statement, {**params, "at": op.at})
        return Counter({(table, "deletes"): cur.rowcount})

    return run


def _with_items(action: str, category: Category) -> Executor:
    """`action` changes one order (CTE `o`, returning its old id) and CTE `i` its items."""
    counts = "SELECT (SELECT count(*) FROM o), (SELECT count(*) FROM i)"
    statement = sql.SQL("WITH pick AS ({}), {} {}").format(
        _pick("orders"), sql.SQL(action), sql.SQL(counts)
    )

    def run(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
        row = cur.execute(statement, {**params, "at": op.at, "new_id": op.new_id}).fetchone()
        n_orders, n_items = (int(str(n)) for n in row or (0, 0))
        return Counter({("orders", category): n_orders, ("order_items", category): n_items})

    return run


def _insert_statement(table: str, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        _table(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )


_INSERT_CUSTOMER = _insert_statement("customers", shop.CUSTOMER_COLUMNS)
_INSERT_ORDER = _insert_statement("orders", shop.ORDER_COLUMNS)
_INSERT_ITEM = _insert_statement("order_items", shop.ITEM_COLUMNS)


def _insert_customer(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
    assert op.new_id is not None
    cur.execute(_INSERT_CUSTOMER, shop.customer_row(random.Random(op.seed), op.new_id))
    return Counter({("customers", "inserts"): 1})


def _insert_order(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
    """An order of customer `op.at` and its `op.rows - 1` items."""
    assert op.new_id is not None
    rng = random.Random(op.seed)
    cur.execute(_INSERT_ORDER, shop.order_row(rng, op.new_id, op.at))
    items = [shop.item_row(rng, op.new_id, n) for n in range(1, op.rows)]
    cur.executemany(_INSERT_ITEM, items)
    return Counter({("orders", "inserts"): 1, ("order_items", "inserts"): len(items)})


_RENUMBER_ITEM = sql.SQL(
    "WITH pick AS ({}), top AS (SELECT max(x.line_no) AS n FROM {} AS x JOIN pick USING (order_id))"
    " UPDATE {} AS t SET line_no = top.n + 1 FROM pick, top WHERE {}"
).format(_pick("order_items"), _table("order_items"), _table("order_items"), _match("order_items"))


def _renumber_item(cur: Cursor, op: Op, params: dict[str, object]) -> Changes:
    cur.execute(_RENUMBER_ITEM, {**params, "at": op.at})
    return Counter({("order_items", "pk_changes"): cur.rowcount})


_TOASTED = "octet_length(notes) > 8000"  # reads the TOAST pointer's size, not the value


def _customer_notes(rng: random.Random) -> dict[str, object]:
    return {"notes": shop.notes_text(rng, big=rng.random() < 0.5)}


_EXECUTORS: Mapping[str, Executor] = MappingProxyType({
    "insert_customer": _insert_customer,
    "insert_order": _insert_order,
    "order_status": _update("orders", "status = %(v)s", lambda r: {"v": r.choice(shop.STATUSES)}),
    "order_total": _update("orders", "total = %(total)s, discount_rate = %(rate)s", lambda r: {
        "total": shop.money(r, 100, 5_000_000), "rate": r.choice((None, 0.05, 0.1, 0.125))}),
    "order_shipping": _update(
        "orders",
        "shipping = coalesce(t.shipping, '{}') || jsonb_build_object('tracking', %(trk)s::text,"
        " 'history', coalesce(t.shipping->'history', '[]') || to_jsonb(%(event)s::text)),"
        " weight_kg = %(kg)s",
        lambda r: {"trk": f"TRK{r.getrandbits(40):012X}", "kg": round(r.random() * 30, 3),
                   "event": r.choice(("picked", "in transit", "zugestellt", "配達済み"))}),
    "item_qty": _update(
        "order_items",
        "qty = %(qty)s, unit_price = %(price)s,"
        " attributes = jsonb_set(coalesce(t.attributes, '{}'), '{size}', to_jsonb(%(size)s::int))",
        lambda r: {"qty": r.randint(1, 20), "price": shop.money(r, 50, 500_000),
                   "size": r.randint(1, 50)}),
    "customer_notes": _update("customers", "notes = %(notes)s", _customer_notes),
    "delete_order": _with_items(
        "o AS (DELETE FROM public.orders AS t USING pick WHERE t.id = pick.id"
        " RETURNING t.id AS old_id), i AS (DELETE FROM public.order_items AS t USING o"
        " WHERE t.order_id = o.old_id RETURNING 1)",
        "deletes"),
    "delete_item": _delete("order_items"),
    "delete_customer": _delete("customers"),
    "renumber_order": _with_items(
        "o AS (UPDATE public.orders AS t SET id = %(new_id)s FROM pick WHERE t.id = pick.id"
        " RETURNING pick.id AS old_id), i AS (UPDATE public.order_items AS t"
        " SET order_id = %(new_id)s FROM o WHERE t.order_id = o.old_id RETURNING 1)",
        "pk_changes"),
    "renumber_item": _renumber_item,
    "customer_balance": _update("customers", "balance = coalesce(t.balance, 0) + %(delta)s",
        lambda r: {"delta": shop.money(r, -50_000, 50_000)}, prefer=_TOASTED),
    "customer_tags": _update("customers", "tags = %(tags)s",
        lambda r: {"tags": r.sample(shop.TAGS, r.randint(0, 4))}, prefer=_TOASTED),
    "customer_profile": _update(
        "customers",
        "profile = jsonb_set(coalesce(t.profile, '{}'), '{address,city}', to_jsonb(%(city)s::text))"
        " || jsonb_build_object('visits', coalesce((t.profile->>'visits')::int, 0) + 1)",
        lambda r: {"city": r.choice(shop.CITIES)}, prefer=_TOASTED),
    "customer_tier": _update("customers", "tier = %(tier)s",
        lambda r: {"tier": r.choice(shop.TIERS)}, prefer=_TOASTED),
})  # fmt: skip
