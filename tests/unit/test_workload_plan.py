"""The workload's pure plan: key shares per connection, transaction shapes, determinism."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from cdc_core.sample import workload
from cdc_core.sample.workload_plan import (
    OP_KINDS,
    VARIANTS,
    KeySpace,
    TxnPlan,
    WorkloadSpec,
    first_at_or_above,
    plan_transaction,
)

BOUNDS = {"customers": (1, 1000), "orders": (1, 3000)}


def _plans(spec: WorkloadSpec, n: int) -> list[TxnPlan]:
    rng, keys = random.Random(spec.seed), KeySpace(BOUNDS, spec.concurrency)
    return [plan_transaction(rng, spec, keys, i % spec.concurrency) for i in range(n)]


@pytest.mark.parametrize(("key", "slot", "slots", "expected"), [
    (10, 0, 3, 12), (10, 1, 3, 10), (10, 2, 3, 11), (7, 0, 1, 7), (0, 4, 5, 4),
])  # fmt: skip
def test_first_at_or_above_is_the_smallest_key_of_the_slot(
    key: int, slot: int, slots: int, expected: int
) -> None:
    assert first_at_or_above(key, slot, slots) == expected


def test_new_ids_stay_in_the_slot_share_above_existing_keys_and_never_repeat() -> None:
    keys = KeySpace(BOUNDS, 3)
    handed = [(slot, keys.new_id("orders", slot)) for _ in range(50) for slot in range(3)]
    assert all(key % 3 == slot for slot, key in handed)
    assert all(key > 3000 for _, key in handed)
    assert len({key for _, key in handed}) == len(handed)


def test_new_ids_of_one_table_do_not_move_the_other() -> None:
    keys = KeySpace(BOUNDS, 2)
    keys.new_id("orders", 0)
    assert keys.top("customers") == 1000
    assert keys.new_id("customers", 1) == 1001


def test_picks_fall_between_the_lowest_key_and_the_newest_id() -> None:
    keys = KeySpace({"customers": (500, 600), "orders": (1, 1)}, 4)
    rng = random.Random(3)
    newest = max(keys.new_id("customers", s) for s in range(4))
    picks = [keys.pick(rng, "customers") for _ in range(2000)]
    assert min(picks) == 500
    assert max(picks) == newest


def test_an_empty_table_still_gets_picks_and_ids_from_one() -> None:
    keys = KeySpace({"customers": (1, 0), "orders": (1, 0)}, 3)
    assert keys.pick(random.Random(1), "orders") == 1
    assert [keys.new_id("orders", s) for s in range(3)] == [3, 1, 2]


def test_the_same_seed_plans_the_same_transactions() -> None:
    spec = WorkloadSpec(changes=100, seed=42)
    assert _plans(spec, 200) == _plans(spec, 200)


def test_a_different_seed_plans_different_transactions() -> None:
    one, two = WorkloadSpec(changes=1, seed=1), WorkloadSpec(changes=1, seed=2)
    assert _plans(one, 50) != _plans(two, 50)


def test_every_step_of_a_transaction_belongs_to_its_slot() -> None:
    plans = _plans(WorkloadSpec(changes=1, concurrency=4), 100)
    assert all(op.slot == plan.slot for plan in plans for op in plan.ops)
    assert all(op.new_id % 4 == plan.slot for plan in plans for op in plan.ops if op.new_id)


def test_transactions_change_about_txn_size_rows() -> None:
    plans = _plans(WorkloadSpec(changes=1, txn_size=(5, 8)), 500)
    sizes = [sum(op.rows for op in plan.ops) for plan in plans]
    largest_step = max(v.rows for v in VARIANTS.values()) + 3  # an order may carry 5 rows
    assert min(sizes) >= 5
    assert max(sizes) < 8 + largest_step


def test_single_row_transactions_have_one_step() -> None:
    plans = _plans(WorkloadSpec(changes=1, txn_size=(1, 1)), 100)
    assert {len(plan.ops) for plan in plans} == {1}


def test_the_rollback_share_follows_the_spec() -> None:
    plans = _plans(WorkloadSpec(changes=1, rollback_fraction=0.2), 4000)
    share = sum(not plan.commit for plan in plans) / len(plans)
    assert 0.17 < share < 0.23


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_rollback_fraction_zero_and_one_are_all_or_nothing(fraction: float) -> None:
    plans = _plans(WorkloadSpec(changes=1, rollback_fraction=fraction), 200)
    assert {plan.commit for plan in plans} == {fraction == 0.0}


@pytest.mark.parametrize("kind", OP_KINDS)
def test_a_mix_of_one_kind_plans_only_that_kind(kind: str) -> None:
    plans = _plans(WorkloadSpec(changes=1, mix={kind: 1.0}), 100)
    kinds = {VARIANTS[op.variant].kind for plan in plans for op in plan.ops}
    assert kinds == {kind}


def test_the_default_mix_uses_every_variant() -> None:
    plans = _plans(WorkloadSpec(changes=1), 1000)
    used = Counter(op.variant for plan in plans for op in plan.ops)
    assert set(used) == set(VARIANTS)


def test_key_changes_and_inserts_get_fresh_ids_and_nothing_else_does() -> None:
    plans = _plans(WorkloadSpec(changes=1), 300)
    for op in (op for plan in plans for op in plan.ops):
        assert (op.new_id is not None) == (VARIANTS[op.variant].new_key is not None)


def test_an_order_insert_carries_one_to_four_items() -> None:
    plans = _plans(WorkloadSpec(changes=1, mix={"insert": 1.0}), 300)
    rows = {op.rows for plan in plans for op in plan.ops if op.variant == "insert_order"}
    assert rows == {2, 3, 4, 5}


def test_every_variant_has_a_statement() -> None:
    assert set(workload._EXECUTORS) == set(VARIANTS)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "set changes or duration_s"),
    ({"changes": 10, "rate": 0}, "rate must be > 0"),
    ({"changes": 10, "txn_size": (3, 2)}, "txn_size must be 1 <= a <= b"),
    ({"changes": 10, "txn_size": (0, 2)}, "txn_size must be 1 <= a <= b"),
    ({"changes": 10, "concurrency": 0}, "concurrency must be >= 1"),
    ({"changes": 10, "rollback_fraction": 1.5}, "rollback_fraction must be in [0, 1]"),
    ({"changes": 10, "mix": {"upsert": 1.0}}, "mix keys must be among"),
    ({"changes": 10, "mix": {"insert": 0.0}}, "mix weights must be >= 0 with a positive sum"),
])  # fmt: skip
def test_a_bad_spec_is_refused_with_the_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        WorkloadSpec(**kwargs)  # type: ignore[arg-type]


def test_a_duration_alone_is_a_valid_spec() -> None:
    assert WorkloadSpec(duration_s=1.5).changes is None
