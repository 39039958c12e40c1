"""Ground truth taken independently on the server: a second slot decoded by test_decoding.

Both slots see the same committed transactions in the same commit order; test_decoding prints
each change as text (`table public.t: INSERT: id[bigint]:1 ...`) using the same output
functions pgoutput uses, so column values compare as text, exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cdc_core.pg.pgoutput import ColumnKind, TupleData, split_row_change
from cdc_core.stager import iter_rows, relations_of, staged_files

UNCHANGED = "<unchanged-toast>"
Row = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Change:
    """One change as both sides can state it."""

    xid: int
    table: str
    op: str  # c u d t
    old: Row | None
    new: Row | None


def create_truth_slot(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (name,))


_HEAD = re.compile(r"table (\S+?): (INSERT|UPDATE|DELETE|TRUNCATE): ?")
_COLUMN = re.compile(r"(\S+?)\[(.*?)\]:")
_OPS = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}


def _value(text: str, pos: int) -> tuple[str | None, int]:
    if text.startswith("'", pos):
        out, i = [], pos + 1
        while True:
            j = text.index("'", i)
            out.append(text[i:j])
            if text.startswith("''", j):
                out.append("'")
                i = j + 2
                continue
            return "".join(out), j + 1
    if text.startswith("B'", pos):  # bit strings
        j = text.index("'", pos + 2)
        return text[pos + 2 : j], j + 1
    end = text.find(" ", pos)
    end = len(text) if end < 0 else end
    raw = text[pos:end]
    return (None if raw == "null" else UNCHANGED if raw == "unchanged-toast-datum" else raw), end


def _tuple(text: str) -> Row:
    pos, out = 0, []
    while pos < len(text):
        m = _COLUMN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse test_decoding tuple at {pos}: {text[pos : pos + 80]!r}")
        value, pos = _value(text, m.end())
        if m.group(2) == "boolean" and value in ("true", "false"):
            value = value[0]  # test_decoding prints true/false; boolout (and pgoutput) t/f
        out.append((m.group(1), value))
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return tuple(out)


def _change(xid: int, line: str) -> Change:
    m = _HEAD.match(line)
    if m is None:
        raise ValueError(f"unexpected test_decoding line: {line[:120]!r}")
    table, op, rest = m.group(1), _OPS[m.group(2)], line[m.end() :]
    if op == "t":
        return Change(xid, table, op, None, None)
    if op == "d":
        return Change(xid, table, op, _tuple(rest), None)
    if op == "u" and rest.startswith("old-key: "):
        old, new = rest[len("old-key: ") :].split(" new-tuple: ", 1)
        return Change(xid, table, op, _tuple(old), _tuple(new))
    return Change(xid, table, op, None, _tuple(rest))


def read_truth(dsn: str, slot: str) -> list[Change]:
    """Every committed change on the truth slot, in commit order (consumes the slot)."""
    changes: list[Change] = []
    xid = 0
    with psycopg.connect(dsn) as conn, conn.cursor(name="truth") as cur:
        cur.execute(
            "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, 'include-xids', '1', "
            "'skip-empty-xacts', '1')",
            (slot,),
        )
        for (line,) in cur:
            if line.startswith("BEGIN "):
                xid = int(line.split()[1])
            elif line.startswith("COMMIT"):
                xid = 0
            elif line.startswith("table "):
                changes.append(_change(xid, line))
    return changes


def _decoded(raw: bytes | None, names: list[str]) -> Row | None:
    if raw is None:
        return None
    out = []
    for name, col in zip(names, TupleData(raw).columns(), strict=True):
        if col.kind is ColumnKind.NULL:
            out.append((name, None))
        elif col.kind is ColumnKind.UNCHANGED_TOAST:
            out.append((name, UNCHANGED))
        else:
            assert col.data is not None
            out.append((name, col.data.decode()))
    return tuple(out)


def staged_changes(changes_dir: Path, tables: set[str] | None = None) -> list[Change]:
    """Every staged change, in file and row order, in the same form as the truth."""
    out: list[Change] = []
    for staged in staged_files(changes_dir):
        path = changes_dir / str(staged)
        relations = relations_of(path)
        for row in iter_rows(path):
            op = str(row["op"])
            if op == "m":
                continue
            rel = relations[(row["relation_oid"], row["relation_version"])]  # type: ignore[index]
            table = f"{rel.schema}.{rel.table}"
            if tables is not None and table not in tables:
                continue
            names = [c.name for c in rel.columns]
            xid = int(row["xid"])  # type: ignore[call-overload]
            message = bytes(row["message"])  # type: ignore[arg-type]
            if op == "t":
                out.append(Change(xid, table, op, None, None))
                continue
            _, _, old, tail = split_row_change(message)
            if op == "d":
                out.append(Change(xid, table, op, _decoded(tail, names), None))
            else:
                out.append(Change(xid, table, op, _decoded(old, names), _decoded(tail, names)))
    return out


def comparable(changes: list[Change]) -> list[Change]:
    """Old rows without their NULL columns: test_decoding prints a DEFAULT old key with only
    the key's columns, where pgoutput sends every column (NULL outside the key)."""
    return [
        Change(
            c.xid,
            c.table,
            c.op,
            None if c.old is None else tuple(x for x in c.old if x[1] is not None),
            c.new,
        )
        for c in changes
    ]
