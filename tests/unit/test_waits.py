"""How the run names the sessions and prepared transactions a statement of its waits for."""

from __future__ import annotations

import pytest

from cdc_core.pg.waits import Holder, lasting, said


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.4, "0 s"), (59.9, "59 s"), (60, "1 min"), (3599, "59 min"), (3600, "1 h 0 min"),
     (3 * 3600 + 5 * 60 + 7, "3 h 5 min"), (86400, "1 d 0 h"), (2 * 86400 + 4 * 3600 + 1, "2 d 4 h")],
)  # fmt: skip
def test_a_duration_reads_in_the_largest_units_that_fit(seconds: float, shown: str) -> None:
    assert lasting(seconds) == shown


def test_a_prepared_transaction_is_named_by_its_gid_with_the_statements_that_end_it() -> None:
    held = Holder(None, "o'clock", "app", "shop", None, None, 7300.0)
    assert (
        str(held)
        == "prepared transaction 'o''clock' (user app, database shop, prepared 2 h 1 min ago)"
    )
    assert held.way_out == (
        "COMMIT PREPARED 'o''clock' or ROLLBACK PREPARED 'o''clock' in database shop"
    )


def test_a_session_is_named_by_its_pid_with_what_its_role_may_see() -> None:
    """Another role's session shows no state nor start to a role without pg_read_all_stats."""
    seen = Holder(42, None, "etl", "shop", "nightly report", "idle in transaction", 95.0)
    assert str(seen) == (
        "pid 42 (user etl, database shop, application 'nightly report', idle in transaction, "
        "transaction open for 1 min)"
    )
    hidden = Holder(43, None, "etl", "shop", None, None, None)
    assert str(hidden) == "pid 43 (user etl, database shop)"
    assert Holder(44, None, None, None, None, None, None).__str__() == "pid 44"
    assert said([seen, hidden]) == (
        f"{seen}: commit or roll back its transaction, or end its session: "
        "SELECT pg_terminate_backend(42); "
        f"{hidden}: commit or roll back its transaction, or end its session: "
        "SELECT pg_terminate_backend(43)"
    )
