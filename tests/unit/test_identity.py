"""Whether a replica identity carries the key a table's deletes are matched by in its mirror."""

from __future__ import annotations

from cdc_core.identifiers import TableName
from cdc_core.pg.identity import identity_problem
from cdc_core.pg.pgoutput import ReplicaIdentity

USERS = TableName("public", "users")
FULL, DEFAULT, NOTHING, INDEX = (
    ReplicaIdentity.FULL, ReplicaIdentity.DEFAULT, ReplicaIdentity.NOTHING, ReplicaIdentity.INDEX
)  # fmt: skip


def test_full_carries_any_key() -> None:
    assert identity_problem(USERS, FULL, ("id",), (), primary_key=("id",)) is None
    assert identity_problem(USERS, FULL, ("email",), (), primary_key=("id",)) is None
    assert identity_problem(USERS, FULL, (), (), primary_key=()) is None


def test_nothing_is_left_to_the_source_which_refuses_update_and_delete() -> None:
    assert identity_problem(USERS, NOTHING, ("id",), (), primary_key=("id",)) is None
    assert identity_problem(USERS, NOTHING, (), (), primary_key=()) is None


def test_default_carries_the_primary_key() -> None:
    assert identity_problem(USERS, DEFAULT, ("id",), ("id",), primary_key=("id",)) is None


def test_default_without_a_primary_key_is_left_to_the_source() -> None:
    assert identity_problem(USERS, DEFAULT, (), (), primary_key=()) is None


def test_default_with_an_override_inside_the_primary_key_passes() -> None:
    key = ("a",)
    assert identity_problem(USERS, DEFAULT, key, ("a", "b"), primary_key=("a", "b")) is None


def test_default_with_an_override_outside_the_primary_key_names_the_column_and_full() -> None:
    problem = identity_problem(USERS, DEFAULT, ("code",), ("id",), primary_key=("id",))

    assert problem == (
        "key column code of public.users is not in its replica identity (DEFAULT: the primary "
        "key id), so its deletes and key changes would not carry it and the mirror would keep "
        "deleted rows. Run ALTER TABLE public.users REPLICA IDENTITY FULL, or key it by its "
        "replica identity (source.message.key.columns: public\\.users:id)"
    )


def test_default_without_a_primary_key_refuses_an_override() -> None:
    problem = identity_problem(USERS, DEFAULT, ("code",), (), primary_key=())

    assert problem is not None
    assert problem.endswith("Run ALTER TABLE public.users REPLICA IDENTITY FULL")


def test_an_index_holding_the_key_passes() -> None:
    problem = identity_problem(
        USERS, INDEX, ("id",), ("id", "email"), primary_key=("id",), index="users_id_email"
    )
    assert problem is None


def test_an_index_keyed_by_override_passes() -> None:
    problem = identity_problem(
        USERS, INDEX, ("email",), ("email",), primary_key=(), index="users_email"
    )
    assert problem is None


def test_an_index_without_the_primary_key_names_the_index_and_default() -> None:
    problem = identity_problem(
        USERS, INDEX, ("id",), ("email",), primary_key=("id",), index="users_email"
    )

    assert problem == (
        "key column id of public.users is not in its replica identity (USING INDEX users_email "
        "(email)), so its deletes and key changes would not carry it and the mirror would keep "
        "deleted rows. Run ALTER TABLE public.users REPLICA IDENTITY DEFAULT, or key it by its "
        "replica identity (source.message.key.columns: public\\.users:email)"
    )


def test_an_index_without_an_override_key_asks_for_full() -> None:
    problem = identity_problem(
        USERS, INDEX, ("code", "id"), ("email",), primary_key=("id",), index="users_email"
    )

    assert problem is not None
    assert problem.startswith("key column code, id of public.users are not in its replica")
    assert "REPLICA IDENTITY FULL" in problem


def test_an_index_on_a_table_without_a_key_asks_for_full_or_an_override() -> None:
    problem = identity_problem(USERS, INDEX, (), ("email",), primary_key=(), index="users_email")

    assert problem == (
        "table public.users has no primary key and REPLICA IDENTITY USING INDEX users_email "
        "(email): its mirror matches whole rows, and its deletes would carry only email, so the "
        "mirror would keep deleted rows. Run ALTER TABLE public.users REPLICA IDENTITY FULL, or "
        "key it by its replica identity (source.message.key.columns: public\\.users:email)"
    )


def test_an_index_the_stream_names_without_its_name_shows_its_columns() -> None:
    problem = identity_problem(USERS, INDEX, (), ("email",), primary_key=())

    assert problem is not None
    assert "REPLICA IDENTITY USING INDEX (email)" in problem


def test_an_index_that_is_gone_acts_as_nothing() -> None:
    assert identity_problem(USERS, INDEX, ("id",), (), primary_key=("id",)) is None
    assert identity_problem(USERS, INDEX, (), (), primary_key=()) is None
