"""Capture golden pgoutput bytes from a real server: `python tests/data/pgoutput/capture.py`.

Each scenario runs its SQL against a fresh database on a throwaway PostgreSQL, then reads the
slot through `pg_logical_slot_get_binary_changes` with the scenario's plugin options and writes
`<scenario>.json` (all of them, or those named on the command line): the SQL, the options, the server version and every message as hex with its
LSN and xid. The golden tests decode these files; rerun this script only to refresh them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from cdc_core.pg.local import throwaway_cluster  # noqa: E402

SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE items (id int PRIMARY KEY, label text, price numeric(10,2), mood mood, "
    "big text, data bytea)",
    "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL",  # out of line, uncompressed
    "CREATE TABLE full_items (id int, label text)",
    "ALTER TABLE full_items REPLICA IDENTITY FULL",
    "CREATE TABLE other (id serial PRIMARY KEY, note text)",
    "CREATE PUBLICATION golden FOR TABLE items, full_items, other",
]

V1 = {"proto_version": "1", "publication_names": "golden", "messages": "true"}
V2_STREAM = {"proto_version": "2", "publication_names": "golden", "streaming": "on"}

SCENARIOS: dict[str, dict[str, object]] = {
    "insert_types": {
        "options": V1,
        "sql": [
            "INSERT INTO items (id, label, price, mood, data) "
            "VALUES (1, 'Zoë 東京', 12.34, 'happy', '\\x00ff10'::bytea)",
            "INSERT INTO items (id, label) VALUES (2, NULL)",
        ],
    },
    "update_key_and_toast": {
        "options": V1,
        "sql": [
            "INSERT INTO items (id, label, big) VALUES (1, 'a', repeat('x', 10000))",
            "UPDATE items SET label = 'b' WHERE id = 1",  # no old tuple; big unchanged TOAST
            "UPDATE items SET id = 10 WHERE id = 1",  # key change: old key 'K'
            "DELETE FROM items WHERE id = 10",  # old key 'K'
        ],
    },
    "replica_identity_full": {
        "options": V1,
        "sql": [
            "INSERT INTO full_items VALUES (1, 'one')",
            "UPDATE full_items SET label = 'uno' WHERE id = 1",  # old row 'O'
            "DELETE FROM full_items WHERE id = 1",  # old row 'O'
        ],
    },
    "update_without_change": {
        "options": V1,
        "sql": [
            "INSERT INTO full_items VALUES (1, 'one'), (2, 'two')",
            "UPDATE full_items SET label = label WHERE id = 1",  # old row 'O' equal to the new
            "UPDATE full_items SET label = 'deux' WHERE id = 2",  # old row 'O', a change
            "INSERT INTO items (id, label) VALUES (1, 'a')",
            "UPDATE items SET label = label WHERE id = 1",  # no old tuple: nothing to compare
        ],
    },
    "truncate": {
        "options": V1,
        "sql": [
            "INSERT INTO other (note) VALUES ('x')",
            "TRUNCATE items, other RESTART IDENTITY CASCADE",
            "TRUNCATE full_items",
        ],
    },
    "messages": {
        "options": V1,
        "sql": [
            "SELECT pg_logical_emit_message(false, 'heartbeat', 'non-transactional')",
            "BEGIN; SELECT pg_logical_emit_message(true, 'outbox', convert_to('{\"a\":1}', "
            "'UTF8')); INSERT INTO other (note) VALUES ('with message'); COMMIT",
        ],
    },
    "origin": {
        "options": V1,
        "sql": [
            "SELECT pg_replication_origin_create('upstream')",
            "SELECT pg_replication_origin_session_setup('upstream'); "
            "BEGIN; SELECT pg_replication_origin_xact_setup('0/AB', now()); "
            "INSERT INTO other (note) VALUES ('replicated'); COMMIT; "
            "SELECT pg_replication_origin_session_reset()",
        ],
    },
    "multi_row": {
        "options": V1,
        "sql": [
            "INSERT INTO other (note) SELECT 'row ' || g FROM generate_series(1, 25) g",
            "SELECT pg_logical_emit_message(false, 'lone', 'between transactions')",
            "UPDATE other SET note = note || '!' WHERE id <= 3",
        ],
    },
    "binary_values": {
        "options": V1 | {"binary": "true"},
        "sql": ["INSERT INTO items (id, label, price) VALUES (7, 'bin', 1.5)"],
    },
    # "B: " runs on a second connection whose transaction stays open across "CAPTURE" (a read
    # of the slot), so the server streams it while it is still in progress.
    "streamed_commit": {
        "options": V2_STREAM,
        "work_mem": "64kB",
        "sql": [
            "B: BEGIN",
            "B: INSERT INTO other (note) SELECT 'row ' || g FROM generate_series(1, 1000) g",
            "CAPTURE",
            "B: INSERT INTO other (note) VALUES ('last')",
            "B: COMMIT",
        ],
    },
    "streamed_abort": {
        "options": V2_STREAM,
        "work_mem": "64kB",
        "sql": [
            "B: BEGIN",
            "B: INSERT INTO other (note) SELECT 'gone ' || g FROM generate_series(1, 1000) g",
            "CAPTURE",
            "B: ROLLBACK",
            "INSERT INTO other (note) VALUES ('after abort')",
        ],
    },
}


def _read_slot(
    conn: psycopg.Connection[tuple[object, ...]], slot: str, options: dict[str, str]
) -> list[dict[str, object]]:
    args = [x for kv in options.items() for x in kv]
    placeholders = ", ".join(["%s"] * len(args))
    rows = conn.execute(
        "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_get_binary_changes("
        f"%s, NULL, NULL, {placeholders})",
        (slot, *args),
    ).fetchall()
    return [{"lsn": lsn, "xid": xid, "hex": bytes(data).hex()} for lsn, xid, data in rows]


def capture(dsn: str, name: str, scenario: dict[str, object]) -> dict[str, object]:
    options: dict[str, str] = scenario["options"]  # type: ignore[assignment]
    steps: list[str] = scenario["sql"]  # type: ignore[assignment]
    messages: list[dict[str, object]] = []
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as b:
        for statement in SETUP:
            conn.execute(statement)
        slot = f"golden_{name}"
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        if "work_mem" in scenario:
            conn.execute(f"SET logical_decoding_work_mem = '{scenario['work_mem']}'")
        for step in steps:
            if step == "CAPTURE":
                # decoding stops at the flushed WAL: commit an xid so the open work is flushed
                conn.execute("SELECT txid_current()")
                messages += _read_slot(conn, slot, options)
            elif step.startswith("B: "):
                b.execute(step[3:])
            else:
                conn.execute(step)
        messages += _read_slot(conn, slot, options)
        version = conn.execute("SHOW server_version").fetchone()
    return {
        "sql": SETUP + steps,
        "options": options,
        "logical_decoding_work_mem": scenario.get("work_mem"),
        "server_version": version[0] if version else None,
        "messages": messages,
    }


def main() -> None:
    wanted = sys.argv[1:] or list(SCENARIOS)  # refresh only the scenarios named, if any
    with throwaway_cluster("golden") as cluster:
        for name in wanted:
            scenario = SCENARIOS[name]
            db = f"golden_{name}"
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{db}"')
            result = capture(cluster.dsn(db), name, scenario)
            (HERE / f"{name}.json").write_text(
                json.dumps(result, indent=1, ensure_ascii=False) + "\n"
            )
            print(f"{name}: {len(result['messages'])} messages")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
