"""The server the tests start really does logical replication: a pgoutput slot sees a change."""

from __future__ import annotations

import psycopg

from tests.integration.conftest import PgServer


def test_server_runs_with_wal_level_logical(pg: PgServer) -> None:
    with psycopg.connect(pg.dsn()) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
    assert row == ("logical",)


def test_a_pgoutput_slot_reads_back_a_change(pg: PgServer, database: str) -> None:
    with psycopg.connect(pg.dsn(database), autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, label text)")
        conn.execute("CREATE PUBLICATION it_pub FOR TABLE items")
        conn.execute("SELECT pg_create_logical_replication_slot('it_slot', 'pgoutput')")
        conn.execute("INSERT INTO items VALUES (42, 'answer')")
        rows = conn.execute(
            "SELECT lsn, xid, data FROM pg_logical_slot_get_binary_changes("
            "'it_slot', NULL, NULL, 'proto_version', '1', 'publication_names', 'it_pub')"
        ).fetchall()
    kinds = [bytes(r[2])[:1] for r in rows]
    assert kinds == [b"B", b"R", b"I", b"C"]  # Begin, Relation, Insert, Commit
    insert = bytes(rows[2][2])
    assert b"42" in insert
    assert b"answer" in insert
