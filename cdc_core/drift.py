"""Schema changes the stream does not show, found at the start of a run and healed by snapshots.

Logical decoding carries rows, not DDL, and these changes leave a mirror wrong with no row event
to say so:

- a renamed column: its values arrive under the new name only with each row's next change;
- a column added with a default, an identity or NOT NULL: existing rows hold a value that no
  change carries;
- a table dropped and created again: the old rows never get their deletes, and the new table's
  first rows may come before it is back in the publication;
- in a table without a key, a dropped column or a type change that rewrites values' text
  (numeric(10,2) -> numeric(12,4), real -> double precision): its mirror is a multiset that
  knows each row by the text of its values, so a later change's old row would match nothing;
- a column's values computed again by `ALTER ... TYPE ... USING expr` to its own type (or one
  that stores values as they are): the catalog keeps the type, the table's storage is new;
- an enum value renamed (`ALTER TYPE ... RENAME VALUE`): every row holding it reads it under
  the new name, with no change;
- a composite type's attribute added or dropped (`ALTER TYPE ... ADD ATTRIBUTE`, or a column
  of a table whose row type a column holds): every value's text changes, with no change;
- in a partitioned table, a partition detached or dropped (its rows stay in the mirror), or a
  table holding rows attached as a partition (its rows never stream);
- not a schema change but the pipeline's: a column's filter or transform changed (excluded,
  kept, masked or hashed otherwise), which rows no change touches again never show.

Each run compares every table's catalog entry (its oid, its columns and types by attnum) with
the entry the previous run recorded. A table that changed like that gets an incremental
snapshot, and a recreated table, or one whose column rules changed, first gets a reset
marker: a transactional logical message written now, so it sits in the WAL before the
snapshot's windows, which silver applies as a TRUNCATE of the mirror. A column added plainly
(NULL in every existing row) needs nothing: the stream says it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdc_core.identifiers import TableName

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class CatalogEntry:
    """A table as the catalog has it now: its oid, its columns by attnum, the columns existing
    rows may hold a value for that no change carried (default, identity, NOT NULL), their types
    by attnum (`format_type`), whether it has a primary key, its storage (its relfilenode, a
    new one each time the table is rewritten; a partitioned table's partitions' as `oid:node`),
    the version of each column's catalog row by attnum (its `pg_attribute` row's xmin: an
    ALTER of the column writes a new one, a VACUUM FULL or a CLUSTER does not), the labels of
    the enum types its columns hold (directly or inside domains, arrays, ranges and composite
    types), by the label's oid, which a RENAME VALUE keeps: (the enum type, the label), and the
    composite types they hold by oid: (the type, its attributes' attnums and types)."""

    oid: int
    columns: Mapping[int, str]
    valued: frozenset[str] = frozenset()
    types: Mapping[int, str] = field(default_factory=dict)
    primary_key: bool = True
    storage: str = ""
    members: tuple[Member, ...] = ()  # a partitioned table's partitions (not recorded)
    rules: Mapping[str, str] = field(default_factory=dict)  # `ColumnRules.applied`
    versions: Mapping[int, str] = field(default_factory=dict)
    labels: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    composites: Mapping[int, tuple[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "oid": self.oid,
            "columns": {str(n): c for n, c in self.columns.items()},
            "types": {str(n): t for n, t in self.types.items()},
            "storage": self.storage,
            "column_versions": {str(n): v for n, v in self.versions.items()},
            "enum_labels": {str(n): list(pair) for n, pair in self.labels.items()},
            "composite_types": {str(n): list(pair) for n, pair in self.composites.items()},
            "column_rules": dict(self.rules),
        }


@dataclass(frozen=True)
class Drift:
    """A change of `table` that the stream did not carry; `reset`: the mirror starts over."""

    table: TableName
    reason: str
    reset: bool = False


def catalog_entries(conn: Conn, tables: Sequence[TableName]) -> dict[TableName, CatalogEntry]:
    """The catalog entry of each table that exists."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT t.ord, c.oid::bigint, a.attnum, a.attname::text,
               a.atthasdef OR a.atthasmissing OR a.attnotnull OR a.attidentity <> '',
               format_type(a.atttypid, a.atttypmod), k.primary_key, k.storage, a.xmin::text
        FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema_name, table_name, ord)
        JOIN pg_namespace n ON n.nspname = t.schema_name
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name
        CROSS JOIN LATERAL (  -- once per table, not per column
            SELECT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
                       AS primary_key,
                   CASE WHEN c.relkind = 'p' THEN coalesce(
                       (SELECT string_agg(p.oid || ':' || p.relfilenode, ',' ORDER BY p.oid)
                        FROM pg_partition_tree(c.oid) pt JOIN pg_class p ON p.oid = pt.relid
                        WHERE pt.level > 0), '')
                   ELSE c.relfilenode::text END AS storage
        ) k
        LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY t.ord, a.attnum
        """,
        ([t.schema for t in tables], [t.name for t in tables]),
    ).fetchall()
    columns: dict[int, dict[int, str]] = {}
    valued: dict[int, set[str]] = {}
    types: dict[int, dict[int, str]] = {}
    oids: dict[int, int] = {}
    keyed: dict[int, bool] = {}
    storage: dict[int, str] = {}
    versions: dict[int, dict[int, str]] = {}
    for ordinal, oid, attnum, name, has_value, type_name, primary_key, files, version in rows:
        i = int(ordinal) - 1
        oids[i], keyed[i], storage[i] = int(oid), bool(primary_key), str(files or "")
        columns.setdefault(i, {})
        valued.setdefault(i, set())
        types.setdefault(i, {})
        versions.setdefault(i, {})
        if attnum is not None:  # a table with no columns has one row of NULLs
            columns[i][int(attnum)] = str(name)
            types[i][int(attnum)] = str(type_name)
            versions[i][int(attnum)] = str(version)
            if has_value:
                valued[i].add(str(name))
    partitioned = [oids[i] for i, files in storage.items() if ":" in files]
    members = _members(conn, partitioned) if partitioned else {}
    held = _held_types(conn, list(oids.values()))
    return {
        tables[i]: CatalogEntry(
            oid,
            columns[i],
            frozenset(valued[i]),
            types[i],
            keyed[i],
            storage[i],
            members.get(oid, ()),
            versions=versions[i],
            labels=held[oid].labels if oid in held else {},
            composites=held[oid].composites if oid in held else {},
        )
        for i, oid in oids.items()
    }


def _held_types(conn: Conn, oids: Sequence[int]) -> dict[int, _Held]:
    """The enum labels and composite types each table's columns hold (through domains, arrays,
    ranges and composite types' attributes), by table oid. The types inside types are found a
    level a query: a recursive query's row estimate is large enough for the server to compile
    it with JIT on every run (about 40 ms, 600 ms the first time, against 1 ms)."""
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT DISTINCT attrelid::bigint, atttypid::bigint FROM pg_attribute "
        "WHERE attrelid = ANY(%s::oid[]) AND attnum > 0 AND NOT attisdropped",
        (list(oids),),
    ).fetchall()
    holders: dict[int, set[int]] = {}  # type oid -> the tables holding it
    for relid, type_oid in rows:
        holders.setdefault(int(type_oid), set()).add(int(relid))
    level = set(holders)
    while level:
        inside: list[tuple[Any, ...]] = conn.execute(_INNER_TYPES, (list(level),)).fetchall()
        level = set()
        for outer, inner in inside:
            tables = holders[int(outer)] - holders.get(int(inner), set())
            if tables:
                holders.setdefault(int(inner), set()).update(tables)
                level.add(int(inner))
    types = list(holders)
    found: dict[int, _Held] = {}
    described: list[tuple[Any, ...]] = conn.execute(_HELD, (types, types)).fetchall()
    for type_oid, kind, oid, type_name, text in described:
        for relid in holders[int(type_oid)]:
            held = found.setdefault(relid, _Held({}, {}))
            kept = held.labels if kind == "e" else held.composites
            kept[int(oid)] = (str(type_name), str(text))
    return found


_INNER_TYPES = """
SELECT t.oid::bigint, inner_type.typid::bigint
FROM pg_type t
CROSS JOIN LATERAL (
    SELECT t.typbasetype WHERE t.typtype = 'd'
    UNION ALL
    SELECT t.typelem WHERE t.typelem <> 0 AND t.typsubscript = 'array_subscript_handler'::regproc
    UNION ALL
    SELECT r.rngsubtype FROM pg_range r WHERE t.typtype = 'r' AND r.rngtypid = t.oid
    UNION ALL
    SELECT ca.atttypid FROM pg_attribute ca
    WHERE t.typtype = 'c' AND ca.attrelid = t.typrelid AND ca.attnum > 0 AND NOT ca.attisdropped
) inner_type(typid)
WHERE t.oid = ANY(%s::oid[])
"""

_HELD = """
SELECT e.enumtypid::bigint, 'e', e.oid::bigint, format_type(e.enumtypid, NULL), e.enumlabel::text
FROM pg_enum e
WHERE e.enumtypid = ANY(%s::oid[])
UNION ALL
SELECT t.oid::bigint, 'c', t.oid::bigint, format_type(t.oid, NULL),
       (SELECT string_agg(ca.attnum || ' ' || format_type(ca.atttypid, ca.atttypmod), ', '
                          ORDER BY ca.attnum)
        FROM pg_attribute ca
        WHERE ca.attrelid = t.typrelid AND ca.attnum > 0 AND NOT ca.attisdropped)
FROM pg_type t
WHERE t.oid = ANY(%s::oid[]) AND t.typtype = 'c'
"""


@dataclass(frozen=True)
class _Held:
    labels: dict[int, tuple[str, str]]
    composites: dict[int, tuple[str, str]]


@dataclass(frozen=True)
class Member:
    """A partition of a partitioned table, at any level. `attached`: made a partition by ATTACH
    PARTITION (its row type is older than its place in the tree), not created as one, which
    starts empty; `filled`: it holds rows (storage of its own that is not empty)."""

    oid: int
    parent: int
    name: str
    attached: bool
    filled: bool


def _members(conn: Conn, oids: Sequence[int]) -> dict[int, tuple[Member, ...]]:
    """The partitions of each partitioned table of `oids`, at every level."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT r.oid, p.relid::oid, p.parentrelid::oid, p.relid::regclass::text,
               t.xmin::text IS DISTINCT FROM i.xmin::text,
               p.isleaf AND pg_relation_size(p.relid) > 0
        FROM unnest(%s::oid[]) AS r(oid)
        CROSS JOIN LATERAL pg_partition_tree(r.oid) p
        JOIN pg_class c ON c.oid = p.relid
        LEFT JOIN pg_type t ON t.oid = c.reltype
        LEFT JOIN pg_inherits i ON i.inhrelid = p.relid AND i.inhparent = p.parentrelid
        WHERE p.level > 0
        """,
        (list(oids),),
    ).fetchall()
    found: dict[int, list[Member]] = {}
    for root, oid, parent, name, attached, filled in rows:
        member = Member(int(oid), int(parent), str(name), bool(attached), bool(filled))
        found.setdefault(int(root), []).append(member)
    return {root: tuple(members) for root, members in found.items()}


def drifts(
    recorded: Mapping[str, object], now: Mapping[TableName, CatalogEntry],
    multisets: Collection[TableName] = (),
) -> list[Drift]:  # fmt: skip
    """What changed between the entries a previous run `recorded` (`CatalogEntry.to_json` by
    table) and the catalog `now`, that the stream did not carry. `multisets`: the tables
    mirrored without a key. A table seen for the first time, or gone, is not drift: new tables
    get their snapshot, missing ones the doctor's error."""
    found = []
    for table, entry in now.items():
        before = recorded.get(str(table))
        if not isinstance(before, dict):
            continue
        if int(before["oid"]) != entry.oid:
            why = f"was dropped and created again (oid {before['oid']}, now {entry.oid})"
            found.append(Drift(table, why, reset=True))
            continue
        if (rules := _rules_changed(before, entry)) is not None:
            found.append(Drift(table, rules, reset=True))
            continue
        names = {int(n): str(c) for n, c in dict(before["columns"]).items()}
        renamed = [f"{names[n]} -> {c}" for n, c in entry.columns.items() if n in names and
                   names[n] != c]  # fmt: skip
        reasons = [f"renamed column {', '.join(renamed)}"] if renamed else []
        reasons += _added(before, names, entry)
        reasons += _rewritten(before, names, entry, multiset=table in multisets)
        reasons += _recomputed(before, names, entry)
        reasons += _relabeled(before, entry)
        reasons += _recomposed(before, entry)
        reasons += _partitions(before, entry)
        if reasons:
            found.append(Drift(table, "; ".join(reasons)))
    return found


def _rules_changed(before: Mapping[str, Any], entry: CatalogEntry) -> str | None:
    """The column filters or transforms that changed for the table (`column.exclude.list`,
    `column.mask.with.8.chars`, ...): the mirror holds values under the old ones, a column the
    new ones drop or mask in the clear in rows no change touches again, so it starts over.
    Only columns in both entries count: a column added since gets its values from the stream,
    under the rules as they are. An entry recorded before the rules were is not compared."""
    then = before.get("column_rules")
    if not isinstance(then, dict):
        return None
    now = entry.rules
    both = set(dict(before["columns"]).values()) & set(entry.columns.values())
    changed = [c for c in sorted(both) if then.get(c) != now.get(c)]
    if not changed:
        return None
    said = "; ".join(f"{c}: {then.get(c, 'kept')} then, {now.get(c, 'kept')} now" for c in changed)
    return f"had its column filters or transforms changed ({said})"


def _added(before: Mapping[str, Any], names: Mapping[int, str], entry: CatalogEntry) -> list[str]:
    """Columns added since `before` whose values in existing rows no change carried: with a
    default, an identity or NOT NULL; under the name of a dropped one (the mirror holds the
    dropped one's values there); in a rewrite of the table (a volatile default, dropped since:
    the catalog no longer says it, the table's new storage does). `names`: `before`'s columns
    by attnum."""
    new = [c for n, c in entry.columns.items() if n not in names]
    again = [c for c in new if c in names.values()]
    valued = [c for c in new if c in entry.valued and c not in again]
    rewritten = _storage_rewritten(str(before.get("storage") or ""), entry.storage)
    filled = [c for c in new if rewritten and c not in valued and c not in again]
    out = []
    if valued:
        out.append(f"added column {', '.join(valued)} with a value in existing rows "
                   "(a default, an identity or NOT NULL)")  # fmt: skip
    if again:
        out.append(f"column {', '.join(again)} dropped and added again (the mirror holds the "
                   "dropped one's values)")  # fmt: skip
    if filled:
        out.append(f"added column {', '.join(filled)} in a rewrite of the table (a volatile "
                   "default: existing rows hold values no change carried)")  # fmt: skip
    return out


def _storage_rewritten(before: str, now: str) -> bool:
    """Whether the table, or a partition it had before and still has, was rewritten (a new
    relfilenode). Partitions come and go without a rewrite (`_partitions`). An entry recorded
    before partitions were known by oid tells nothing."""
    old, new = _partition_files(before), _partition_files(now)
    if old is not None and new is not None:
        return any(new[oid] != node for oid, node in old.items() if oid in new)
    if ":" in now or "," in before:
        return False  # a partitioned table recorded the older way
    return bool(before) and before != now


def _partition_files(storage: str) -> dict[str, str] | None:
    """A partitioned table's `oid:node` storage by partition oid; None for another table's."""
    parts = storage.split(",") if storage else []
    if not all(":" in part for part in parts) or (not parts and storage):
        return None
    return dict(part.split(":", 1) for part in parts)


def _partitions(before: Mapping[str, Any], entry: CatalogEntry) -> list[str]:
    """Rows a partitioned table gained or lost with no change: a partition detached or dropped
    (its rows stay in the mirror), or a table holding rows attached as one (its rows never
    reach it). A partition created as one starts empty: its rows stream."""
    old = _partition_files(str(before.get("storage") or "")) if "storage" in before else None
    if old is None or (":" not in entry.storage and entry.storage):
        return []
    members = {m.oid: m for m in entry.members}
    out = []
    gone = sorted(int(oid) for oid in old if int(oid) not in members)
    if gone:
        out.append(f"{len(gone)} partition{'s' if len(gone) > 1 else ''} detached or dropped "
                   f"(oid {', '.join(map(str, gone))}): the mirror holds rows no change "
                   "deleted")  # fmt: skip
    attached = sorted({
        above.name for m in members.values() if m.filled and str(m.oid) not in old
        for above in _chain(m, members) if str(above.oid) not in old and above.attached
    })  # fmt: skip
    if attached:
        out.append(f"{', '.join(attached)} attached as a partition holding rows no change "
                   "carried")  # fmt: skip
    return out


def _chain(member: Member, members: Mapping[int, Member]) -> list[Member]:
    """`member` and the partitions above it, up to the partitioned table (not included)."""
    chain = [member]
    while chain[-1].parent in members:
        chain.append(members[chain[-1].parent])
    return chain


def _rewritten(
    before: Mapping[str, Any], names: Mapping[int, str], entry: CatalogEntry, *, multiset: bool
) -> list[str]:
    """Values the table rewrote in place, with no change: columns of a type now that stores or
    writes their values otherwise (char(n) -> text trims them; a real in the batch before the
    ALTER would be typed as a double). A multiset knows each row by its values' text: a
    dropped column, or any change of a value's text, counts there. An entry recorded before
    types were lacks them: only drops are found. `names`: `before`'s columns by attnum."""
    types = {int(n): str(t) for n, t in dict(before.get("types") or {}).items()}
    dropped = [c for n, c in names.items() if n not in entry.columns] if multiset else []
    out = [f"dropped column {', '.join(dropped)}"] if dropped else []
    kept = _same_text if multiset else _same_value
    out += [
        f"column {c} changed type ({types[n]} -> {entry.types[n]})"
        for n, c in entry.columns.items()
        if n in types and n in entry.types and not kept(types[n], entry.types[n])
    ]
    if out and multiset:
        out[-1] += " (a table without a key: its mirror knows rows by their values' text)"
    elif out:
        out[-1] += ", rewriting its rows in place"
    return out


def _recomputed(
    before: Mapping[str, Any], names: Mapping[int, str], entry: CatalogEntry
) -> list[str]:
    """Columns whose values an `ALTER ... TYPE ... USING expr` computed again: the column was
    altered (its catalog row is new), the table was rewritten (its storage is new), and the type
    it has now would not have rewritten it (the same type, a longer string, ...): the USING
    expression did, and no change carried its values. Under a type change that rewrites the
    table anyway (integer -> bigint, arrays), a USING expression is not told from a plain
    change. A VACUUM FULL in the same interval as another ALTER of the column (SET NOT NULL,
    SET STATISTICS, a column GRANT) looks the same: the table is read again for nothing.
    An entry recorded before versions were tells nothing. `names`: `before`'s columns."""
    versions = {int(n): str(v) for n, v in dict(before.get("column_versions") or {}).items()}
    types = {int(n): str(t) for n, t in dict(before.get("types") or {}).items()}
    if not _storage_rewritten(str(before.get("storage") or ""), entry.storage):
        return []
    altered = [
        c for n, c in entry.columns.items()
        if n in versions and n in types and n in entry.types and names.get(n) == c
        and entry.versions.get(n, versions[n]) != versions[n]
        and _stored_as_is(types[n], entry.types[n])
    ]  # fmt: skip
    if not altered:
        return []
    return [f"column {', '.join(altered)} computed again in a rewrite of the table (ALTER ... "
            "TYPE ... USING)"]  # fmt: skip


def _relabeled(before: Mapping[str, Any], entry: CatalogEntry) -> list[str]:
    """Enum values renamed (`ALTER TYPE ... RENAME VALUE`): the label keeps its oid, and every
    row holding it reads it under the new name with no change, while the mirror holds the old
    one."""
    renamed = [
        f"{type_name} {_literal(old)} -> {_literal(new)}"
        for type_name, old, new in _changed(before, "enum_labels", entry.labels)
    ]
    if not renamed:
        return []
    return [f"enum value renamed ({', '.join(renamed)}: rows holding it read the new name)"]


def _recomposed(before: Mapping[str, Any], entry: CatalogEntry) -> list[str]:
    """Composite types whose attributes were added or dropped since `before`: a value's text
    has a field more or fewer (`(1,2)` reads `(1,2,)`), in every row, with no change. A
    renamed attribute changes no text."""
    return [
        f"composite type {type_name}'s attributes changed ({old} -> {new}: every value of it "
        "reads otherwise)"
        for type_name, old, new in _changed(before, "composite_types", entry.composites)
    ]


def _changed(
    before: Mapping[str, Any], key: str, now: Mapping[int, tuple[str, str]]
) -> list[tuple[str, str, str]]:
    """(type, then, now) for each entry of `now` (by oid: the type and a text) whose text is not
    the one `before` recorded under `key`. An entry recorded before `key` was tells nothing."""
    then = before.get(key)
    if not isinstance(then, dict):
        return []
    found = []
    for oid, (type_name, text) in sorted(now.items()):
        old = then.get(str(oid))
        if isinstance(old, list) and len(old) == 2 and old[1] != text:
            found.append((type_name, str(old[1]), text))
    return found


def _literal(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _stored_as_is(old: str, new: str) -> bool:
    """Whether `ALTER ... TYPE new` without USING leaves a column of type `old` as it is
    stored, with no rewrite of the table (`format_type`s): the same type, a longer or unbounded
    string, a numeric of more precision at its scale or unconstrained, a finer timestamp or
    time. Checked against PostgreSQL 15; any other change rewrites the table by itself."""
    if old == new:
        return True
    if "[" in old or "[" in new:
        return False
    if old.partition("(")[0] in _STRINGS and new.partition("(")[0] in _STRINGS:
        was_long, now_long = _length(old), _length(new)
        return now_long is None or (was_long is not None and was_long <= now_long)
    if old.startswith("numeric("):
        if new == "numeric":
            return True
        return new.startswith("numeric(") and _scale(new) == _scale(old) and (
            _digits(new)[0] >= _digits(old)[0])  # fmt: skip
    was, now = _temporal(old), _temporal(new)
    return was is not None and now is not None and was[0] == now[0] and was[1] <= now[1]


def _length(string_type: str) -> int | None:
    """A varchar's length; None for text or a varchar without one."""
    found = re.search(r"\((\d+)\)", string_type)
    return int(found[1]) if found else None


_INTEGERS = frozenset({"smallint", "integer", "bigint"})
_STRINGS = frozenset({"text", "character varying"})
_TEMPORAL = re.compile(r"(timestamp|time)(?:\((\d)\))?( with(?:out)? time zone)")


def _same_text(old: str, new: str) -> bool:
    """Whether a value of type `old` keeps its text as a value of type `new` (`format_type`s):
    integers widened, varchar lengths changed, a numeric's precision changed at its scale, a
    timestamp's or time's precision increased."""
    if old.count("[") != new.count("["):
        return False
    old, new = old.partition("[")[0], new.partition("[")[0]
    if old == new or (old in _INTEGERS and new in _INTEGERS):
        return True
    if old.partition("(")[0] in _STRINGS and new.partition("(")[0] in _STRINGS:
        return True
    if old.startswith("numeric("):
        return new == "numeric" or (new.startswith("numeric(") and _scale(new) == _scale(old))
    was, now = _temporal(old), _temporal(new)
    return was is not None and now is not None and was[0] == now[0] and was[1] <= now[1]


def _same_value(old: str, new: str) -> bool:
    """Whether a value of type `old` is the same typed value as a value of type `new`: it keeps
    its text, or a numeric gains scale and keeps its integer digits (1.50 is 1.5000)."""
    if _same_text(old, new):
        return True
    if (
        old.startswith("numeric(")
        and new.startswith("numeric(")
        and old.count("[") == new.count("[")
    ):
        (p, s), (p2, s2) = _digits(old), _digits(new)
        return s2 >= s and p2 - s2 >= p - s
    return False


def _scale(numeric: str) -> str:
    return numeric.partition("[")[0].removesuffix(")").partition(",")[2]


def _digits(numeric: str) -> tuple[int, int]:
    p, _, s = numeric.partition("[")[0].removeprefix("numeric(").removesuffix(")").partition(",")
    return int(p), int(s or 0)


def _temporal(type_name: str) -> tuple[str, int] | None:
    """A timestamp's or time's kind (with its zone) and precision (6 unless given); None for
    any other type."""
    found = _TEMPORAL.fullmatch(type_name)
    if found is None:
        return None
    return found[1] + found[3], int(found[2] or 6)
