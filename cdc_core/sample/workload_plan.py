"""The pure half of the workload: its spec, the key space split per connection and the plan
of each transaction. No I/O; `workload.py` runs the plan against PostgreSQL.

Each connection ("slot") owns the keys with `key % concurrency == slot` (orders and their
items by order id) and hands out new keys from that class only, so an open transaction never
touches a row another open one holds. Everything a plan says (which statement, the key to
start looking from, new ids, the seed of the written values) comes from the spec's seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

OpKind = Literal["insert", "update", "delete", "pk_change", "toast_untouched_update"]
OP_KINDS: tuple[OpKind, ...] = ("insert", "update", "delete", "pk_change", "toast_untouched_update")
DEFAULT_MIX: Mapping[str, float] = MappingProxyType(
    {"insert": 0.3, "update": 0.3, "delete": 0.1, "pk_change": 0.1, "toast_untouched_update": 0.2}
)


@dataclass(frozen=True)
class WorkloadSpec:
    """What to run; at least one of `changes` and `duration_s` ends it."""

    changes: int | None = None
    """Stop starting transactions after about this many row changes (committed or not)."""
    duration_s: float | None = None
    """Stop starting transactions after this many seconds."""
    rate: float | None = None
    """Target row changes per second; None runs as fast as possible."""
    txn_size: tuple[int, int] = (1, 20)
    """Rows changed per transaction, uniform in [a, b]; about, as a multi-row step is not split."""
    concurrency: int = 3
    """Transactions open at once, one connection each."""
    rollback_fraction: float = 0.05
    """Share of transactions that end in ROLLBACK."""
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    """Weights of the operation kinds in `OP_KINDS`; missing kinds weigh 0."""
    seed: int = 1

    def __post_init__(self) -> None:
        problems = [
            self.changes is None and self.duration_s is None and "set changes or duration_s",
            self.changes is not None and self.changes < 0 and "changes must be >= 0",
            self.rate is not None and self.rate <= 0 and "rate must be > 0 (None: unthrottled)",
            not 1 <= self.txn_size[0] <= self.txn_size[1] and "txn_size must be 1 <= a <= b",
            self.concurrency < 1 and "concurrency must be >= 1",
            not 0 <= self.rollback_fraction <= 1 and "rollback_fraction must be in [0, 1]",
            bool(set(self.mix) - set(OP_KINDS)) and f"mix keys must be among {OP_KINDS}",
            (min(self.mix.values(), default=0) < 0 or sum(self.mix.values()) <= 0)
            and "mix weights must be >= 0 with a positive sum",
        ]
        if any(problems):
            raise ValueError(f"WorkloadSpec: {'; '.join(p for p in problems if p)}: {self!r}")


@dataclass(frozen=True)
class Variant:
    """One concrete statement shape behind an operation kind."""

    kind: OpKind
    weight: float
    space: str
    """Key space the row to change is picked from (order_items are picked by order id)."""
    rows: int
    """Rows it is expected to change, for sizing transactions (an order insert draws its own
    count: the order and 1..4 items)."""
    new_key: str | None = None
    """Table whose key space hands it a fresh id."""


VARIANTS: Mapping[str, Variant] = MappingProxyType({
    "insert_customer": Variant("insert", 1, "customers", 1, new_key="customers"),
    "insert_order": Variant("insert", 3, "customers", 3, new_key="orders"),
    "order_status": Variant("update", 3, "orders", 1),
    "order_total": Variant("update", 1, "orders", 1),
    "order_shipping": Variant("update", 1, "orders", 1),
    "item_qty": Variant("update", 2, "orders", 1),
    "customer_notes": Variant("update", 1, "customers", 1),
    "delete_order": Variant("delete", 2, "orders", 4),
    "delete_item": Variant("delete", 1, "orders", 1),
    "delete_customer": Variant("delete", 1, "customers", 1),
    "renumber_order": Variant("pk_change", 1, "orders", 4, new_key="orders"),
    "renumber_item": Variant("pk_change", 1, "orders", 1),
    "customer_balance": Variant("toast_untouched_update", 2, "customers", 1),
    "customer_tags": Variant("toast_untouched_update", 1, "customers", 1),
    "customer_profile": Variant("toast_untouched_update", 1, "customers", 1),
    "customer_tier": Variant("toast_untouched_update", 1, "customers", 1),
})  # fmt: skip


@dataclass(frozen=True)
class Op:
    """One planned step of a transaction."""

    variant: str
    slot: int
    at: int
    """Change the first row of the slot's share with key >= `at` (wrapping); for an order
    insert, its customer id."""
    new_id: int | None
    rows: int
    seed: int
    """Seed of the values the step writes."""


@dataclass(frozen=True)
class TxnPlan:
    slot: int
    ops: tuple[Op, ...]
    commit: bool


class KeySpace:
    """Keys of customers and orders split into one residue class per slot: picks and new ids
    of a slot stay in its class, new ids start above every key that existed at the start."""

    def __init__(self, bounds: Mapping[str, tuple[int, int]], slots: int) -> None:
        self.slots = slots
        self._low = {t: lo for t, (lo, _) in bounds.items()}
        self._top = {t: hi for t, (_, hi) in bounds.items()}
        self._next = {t: [first_at_or_above(hi + 1, s, slots) for s in range(slots)]
                      for t, (_, hi) in bounds.items()}  # fmt: skip

    def new_id(self, table: str, slot: int) -> int:
        key = self._next[table][slot]
        self._next[table][slot] = key + self.slots
        self._top[table] = max(self._top[table], key)
        return key

    def top(self, table: str) -> int:
        """The largest key that existed at the start or was handed out since."""
        return self._top[table]

    def pick(self, rng: random.Random, table: str) -> int:
        lo, hi = self._low[table], self._top[table]
        return lo + int(rng.random() * (hi - lo + 1))


def plan_transaction(rng: random.Random, spec: WorkloadSpec, keys: KeySpace, slot: int) -> TxnPlan:
    """The steps of the next transaction of `slot`: about `spec.txn_size` rows."""
    kinds = [k for k in OP_KINDS if spec.mix.get(k, 0) > 0]
    weights = [spec.mix[k] for k in kinds]
    target, ops, rows = rng.randint(*spec.txn_size), [], 0
    while rows < target:
        kind = rng.choices(kinds, weights)[0]
        names = [n for n, v in VARIANTS.items() if v.kind == kind]
        name = rng.choices(names, [VARIANTS[n].weight for n in names])[0]
        variant = VARIANTS[name]
        n_rows = 2 + int(rng.random() * 4) if name == "insert_order" else variant.rows
        new_id = keys.new_id(variant.new_key, slot) if variant.new_key else None
        at = keys.pick(rng, variant.space)
        ops.append(Op(name, slot, at, new_id, n_rows, rng.getrandbits(63)))
        rows += n_rows
    return TxnPlan(slot, tuple(ops), commit=rng.random() >= spec.rollback_fraction)


def first_at_or_above(key: int, slot: int, slots: int) -> int:
    """The smallest key >= `key` that belongs to `slot`."""
    return key + (slot - key) % slots
