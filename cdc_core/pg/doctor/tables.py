"""The doctor's checks of the tables the pipeline reads: each configured table (there and
readable, or the name it was likely renamed to) and the signal table."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from cdc_core.columns import CHARACTER_TYPES, SILVER_OWN, ColumnRules, declared_length
from cdc_core.errors import first_line
from cdc_core.identifiers import TableName
from cdc_core.pg import catalog
from cdc_core.pg.catalog import TableInfo
from cdc_core.pg.doctor.context import Context, quoted, table_id
from cdc_core.pg.doctor.report import Check, Status
from cdc_core.signals import signal_table_ddl


def guardrail(ctx: Context) -> list[Check]:
    """Debezium's guardrail.collections.max: the captured tables against the most allowed
    (no line when there is no limit). Past it, a warning or, with limit.action fail, a failure
    that stops the run."""
    source = ctx.source
    most, count = source.guardrail_collections_max, len(source.tables)
    if not most:
        return []
    if count <= most:
        detail = f"{count} tables captured, at most {most} (guardrail.collections.max)"
        return [Check("guardrail", "pass", detail)]
    status: Status = "fail" if source.guardrail_collections_limit_action == "fail" else "warn"
    which = (f"{source.tables_key} lets {count} tables through" if source.discovered
             else f"source.tables lists {count} tables")  # fmt: skip
    detail = f"{which}, more than guardrail.collections.max ({most})"
    fix = (f"{ctx.pipeline_file}: narrow {source.tables_key}, or raise "
           "source.guardrail.collections.max if they are all meant")  # fmt: skip
    return [Check("guardrail", status, detail, fix)]


def tables(ctx: Context) -> list[Check]:
    known: list[TableName] | None = None  # read only when a table is missing
    checks = []
    rules = ctx.source.column_rules()
    for t, info in ctx.tables.items():
        if info is None:
            known = catalog.list_tables(ctx.conn) if known is None else known
            checks.append(_missing_table(ctx, t, known))
            continue
        if info.persistence != "p":
            checks.append(_not_logged(ctx, t, info))
            continue
        fixes = _read_grants(ctx, t, info)
        clashes = column_clashes(t, info, rules)
        if clashes:
            pairs = [c for p, c in clashes.items() if p.startswith("columns ")]
            both = (" (the lists match names ignoring case: each pair's columns both go)"
                    if pairs else "")  # fmt: skip
            fix = (
                f"rename one of each pair (ALTER TABLE ... RENAME COLUMN), or leave it out of the "
                f"mirror{both}: {ctx.pipeline_file}: source.column.exclude.list: "
                f"{','.join(re.escape(f'{t.schema}.{t.name}.{c}') for c in clashes.values())}"
            )
            detail = "; ".join(clashes)
            checks.append(Check(f"table {t}", "fail", detail, "\n".join([*fixes, fix])))
        elif fixes:
            detail = f"{info.kind} table; {quoted(ctx.role.name)} cannot SELECT it"
            checks.append(Check(f"table {t}", "fail", detail, "\n".join(fixes)))
        elif info.row_security:
            checks.append(_row_security(ctx, t, info))
        else:
            checks.append(Check(f"table {t}", "pass", f"{info.kind} table, SELECT granted"))
            if t in ctx.selects:
                checks.append(_snapshot_select(ctx, t, info, ctx.selects[t], rules))
    return checks


def _not_logged(ctx: Context, t: TableName, info: TableInfo) -> Check:
    """An unlogged or temporary table: its changes are not in the WAL, so no slot sees them,
    and PostgreSQL refuses it a place in a publication."""
    kind = "unlogged" if info.persistence == "u" else "temporary"
    leave = f"leave it out of {ctx.pipeline_file}: {ctx.source.tables_key}"
    if kind == "unlogged":
        logged = ctx.render("ALTER TABLE {} SET LOGGED;", table_id(t))
        leave = (
            f"{logged} (it rewrites the table, and its changes are logged from then on)\nor {leave}"
        )
    return Check(
        f"table {t}", "fail",
        f"{kind} table: its changes are not written to the WAL, so logical replication never "
        "sees them (PostgreSQL refuses it in a publication)", leave,
    )  # fmt: skip


_BASE_TYPES = """
SELECT a.attname::text, coalesce(b.typname, t.typname)::text
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype
WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s)
"""


_EXACT = {
    "decimal.handling.mode": "decimal.handling.mode: precise (or string)",
    "interval.handling.mode": "interval.handling.mode: string",
}


def _key_rows(
    ctx: Context, query: str
) -> Iterator[tuple[TableName, tuple[str, ...], list[tuple[Any, ...]]]]:
    """Each present table, its key (message.key.columns, else the primary key) and `query`'s
    rows for the key's columns (none without a key)."""
    for t, info in ctx.tables.items():
        if info is None:
            continue
        key = ctx.source.message_key_columns.for_table(t, info.columns) or info.primary_key
        rows = ctx.conn.execute(query, (str(t), list(key))).fetchall() if key else []
        yield t, key, rows


def approximate_keys(ctx: Context) -> list[Check]:
    """A key column silver types approximately (an option the pipeline sets) makes distinct
    source keys that round to one value one mirror row, as they would be one Kafka key under
    Debezium: said, with the options that keep keys exact."""
    if not ctx.approximate:
        return []
    checks = []
    for t, _, rows in _key_rows(ctx, _BASE_TYPES):
        found = {str(c): ctx.approximate[str(b)] for c, b in rows if str(b) in ctx.approximate}
        if not found:
            continue
        detail = (
            f"key column {', '.join(f'{quoted(c)} ({o})' for c, o in sorted(found.items()))} is "
            "typed approximately in silver: distinct keys that round to one value become one "
            "mirror row (cdc validate reports it as key not unique)"
        )
        exact = sorted({_EXACT[o.split(":")[0]] for o in found.values()})
        fix = f"keep key columns exact: {ctx.pipeline_file}: silver: {'; '.join(exact)}"
        checks.append(Check(f"key types {t}", "warn", detail, fix))
    return checks


_KEY_TYPES = """
SELECT a.attname::text, a.atttypid::int, a.atttypmod
FROM pg_attribute a
WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s)
"""


def key_transforms(ctx: Context) -> list[Check]:
    """A column transform on a key column rewrites the key silver matches rows by. A mask
    gives every row one key and a truncation gives keys that share their first characters
    one: the mirror would keep one row of them, and a delete of any would take it. Debezium
    leaves an event's key out of its transforms; here the raw key would land in clear, so a
    run stops instead, with the ways out. A hash keeps distinct keys apart, unless it is cut
    short to the column's declared length (varchar(n), char(n)): said, as a warning."""
    rules = ctx.source.column_rules()
    if not rules.rules:
        return []
    checks = []
    for t, key, rows in _key_rows(ctx, _KEY_TYPES):
        by_name = {str(name): (int(oid), int(mod)) for name, oid, mod in rows}
        named = [c for c in key if c in by_name]
        types = catalog.resolve_types(ctx.conn, [by_name[c] for c in named])
        collapsing, cut = [], []
        for c, (base, _, modifier, array) in zip(named, types, strict=True):
            rule = rules.rule_for(f"{t.schema}.{t.name}.{c}")
            if rule is None or array or base not in CHARACTER_TYPES:
                continue  # transforms rewrite character values only
            length = declared_length(base, modifier)
            if rule.truncate is not None or rule.mask is not None:
                collapsing.append(f"{quoted(c)} ({rule.key})")
            elif length is not None and length < rule.digest_chars:
                declared = f"{'char' if base == 'bpchar' else base}({length})"
                cut.append(
                    f"{quoted(c)} ({rule.key}, cut to {length} of its {rule.digest_chars} hex "
                    f"characters by its type, {declared})"
                )
        where = f"{ctx.pipeline_file}: source.column.transforms"
        if collapsing:
            detail = (
                f"key column {', '.join(collapsing)} would be rewritten: distinct keys that a "
                "mask or truncation makes equal become one mirror row, and a delete of any of "
                "them deletes it"
            )
            fix = (f"leave key columns out of the rule's columns: {where}\nor hash them "
                   "instead (column.mask.hash.v2.SHA-256.with.salt.<salt>), which keeps "
                   "distinct keys apart")  # fmt: skip
            checks.append(Check(f"key transforms {t}", "fail", detail, fix))
        elif cut:
            detail = (
                f"key column {', '.join(cut)}: distinct keys can hash to one value and become "
                "one mirror row"
            )
            fix = f"leave key columns out of the hash, or widen them: {where}"
            checks.append(Check(f"key transforms {t}", "warn", detail, fix))
    return checks


_UNIQUE_WITHIN = """
SELECT EXISTS (
    SELECT 1 FROM pg_index i
    WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indisvalid
      AND i.indpred IS NULL AND i.indexprs IS NULL
      AND ARRAY(SELECT a.attname::text
                FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE k.ord <= i.indnkeyatts) <@ %s::text[])
"""


def message_keys(ctx: Context) -> list[Check]:
    """A message.key.columns key that no primary key or unique index (whole-table, on
    columns) is within may repeat: rows sharing it become one mirror row, and a delete of any
    of them deletes it, as they would be one Kafka key under Debezium (which asks for "the
    fewest columns that are unique"). Said, as a warning: the application may keep it unique."""
    checks = []
    for t, info in ctx.tables.items():
        if info is None:
            continue
        key = ctx.source.message_key_columns.for_table(t, info.columns)
        if not key or (info.primary_key and set(info.primary_key) <= set(key)):
            continue
        ((unique,),) = ctx.conn.execute(_UNIQUE_WITHIN, (str(t), list(key))).fetchall()
        if unique:
            continue
        detail = (
            f"message.key.columns key ({', '.join(map(quoted, key))}) is not kept unique by a "
            "primary key or unique index: rows that share it become one mirror row, and a delete "
            "of any of them deletes it (cdc validate reports it as key not unique)"
        )
        columns = sql.SQL(", ").join(map(sql.Identifier, key))
        fix = (f"{ctx.render('CREATE UNIQUE INDEX ON {} ({});', table_id(t), columns)} (if "
               "it holds)\nor add columns to the key until it is unique: "
               f"{ctx.pipeline_file}: source.message.key.columns")  # fmt: skip
        checks.append(Check(f"message key {t}", "warn", detail, fix))
    return checks


def _row_security(ctx: Context, t: TableName, info: TableInfo) -> Check:
    """Row-level security would hand the role's reads only the rows its policies let through,
    while the stream sends every change: a snapshot would be short of rows, silently. The
    product's reading sessions run with row_security off, so such a read fails; the fixes let
    the role read every row."""
    detail = (
        f"row-level security filters the rows {quoted(ctx.role.name)} reads of it: a snapshot "
        "would read only the rows its policies let through (the stream sends every change)"
    )
    fixes = [ctx.render("ALTER ROLE {} BYPASSRLS;", ctx.role_id) + " (as a superuser)"]
    fixes.append(ctx.render("or ALTER TABLE {} DISABLE ROW LEVEL SECURITY;", table_id(t)))
    if info.is_owner:
        fixes.append(ctx.render("or ALTER TABLE {} NO FORCE ROW LEVEL SECURITY;", table_id(t)))
    return Check(f"table {t}", "fail", detail, "\n".join(fixes))


def _snapshot_select(
    ctx: Context, t: TableName, info: TableInfo, query: str, rules: ColumnRules
) -> Check:
    """Whether the table's snapshot.select.statement.overrides SELECT runs (planned and asked
    for no row, read-only) and returns every column a snapshot of the table reads, by name."""
    name = f"snapshot select {t}"
    where = f"{ctx.pipeline_file}: snapshot.select.statement.overrides.{t.qualified}"
    try:
        with ctx.conn.transaction():
            ctx.conn.execute("SET TRANSACTION READ ONLY")
            cursor = ctx.conn.execute(f"SELECT * FROM ({query}) AS cdc_selected LIMIT 0")
            returned = [d.name for d in cursor.description or ()]
    except psycopg.Error as e:
        return Check(name, "fail", f"the SELECT does not run: {first_line(e)}",
                     f"correct the SELECT in {where}")  # fmt: skip
    identity = set(info.primary_key) | set(info.identity_columns)
    read = [c for c in info.columns if c in identity or rules.keeps(t, c)]
    missing = [c for c in read if c not in returned]
    twice = sorted({c for c in returned if returned.count(c) > 1 and c in read})
    if missing or twice:
        detail = "; ".join(
            ([f"it returns no column {', '.join(map(quoted, missing))}"] if missing else [])
            + ([f"it returns {', '.join(map(quoted, twice))} twice"] if twice else [])
        )
        fix = (f"return every column a snapshot reads, by name ({', '.join(read)}), once: "
               f"{where}")  # fmt: skip
        return Check(name, "fail", detail, fix)
    return Check(name, "pass", f"returns the {len(read)} columns a snapshot reads")


def column_clashes(t: TableName, info: TableInfo, rules: ColumnRules) -> dict[str, str]:
    """Columns silver cannot hold apart, each problem with the column to leave out: PostgreSQL
    tells "Note" from note, but Spark and Delta match column names without case (Java's
    lower case), and silver adds columns of its own (`SILVER_OWN`); and a column silver cannot
    hold at all: a name with a backtick (Delta's MERGE with its change feed fails on it)."""
    identity = set(info.primary_key) | set(info.identity_columns)
    kept = [c for c in info.columns if c in identity or rules.keeps(t, c)]
    seen = {c.lower(): f"a column silver adds to every mirror ({c})" for c in SILVER_OWN}
    clashes = {}
    for column in kept:
        if "`" in column:  # Delta's MERGE names its change feed's columns unquoted
            clashes[f"column {quoted(column)} has a backtick, which Delta's MERGE cannot take"] = (
                column
            )
            continue
        first = seen.setdefault(column.lower(), column)
        if first == column:
            continue
        if first.startswith("a column silver adds"):
            clashes[f"column {quoted(column)} is {first}"] = column
        else:
            problem = (
                f"columns {quoted(first)} and {quoted(column)} are one column to Spark and Delta"
            )
            clashes[problem] = column
    return clashes


def _read_grants(ctx: Context, t: TableName, info: TableInfo) -> list[str]:
    """The grants the role lacks to read the table: USAGE on its schema, SELECT on it."""
    fixes = []
    if not info.schema_usage:
        grant = "GRANT USAGE ON SCHEMA {} TO {};"
        fixes.append(ctx.render(grant, sql.Identifier(t.schema), ctx.role_id))
    if not info.can_select:
        fixes.append(ctx.render("GRANT SELECT ON {} TO {};", table_id(t), ctx.role_id))
    return fixes


def _missing_table(ctx: Context, t: TableName, known: list[TableName]) -> Check:
    where = f"{ctx.pipeline_file}: source.tables:"
    renamed = _renamed(ctx, t)
    if renamed is not None:
        return renamed
    by_text = {k.qualified.lower(): k for k in known}
    close = difflib.get_close_matches(t.qualified.lower(), list(by_text), n=1, cutoff=0.6)
    if not close:
        detail = f"{t} does not exist in database {quoted(ctx.database.name)}"
        return Check(f"table {t}", "fail", detail, f"create it, or {where} remove {t}")
    match = by_text[close[0]]
    detail = f"{t} does not exist (did you mean {match}?)"
    return Check(f"table {t}", "fail", detail, f"{where} write {match} instead of {t}")


def _renamed(ctx: Context, t: TableName) -> Check | None:
    """A missing table that is likely renamed or moved: the pipeline's publication (which
    publishes a table by its oid, whatever its name) publishes one table source.tables does not
    name. Renamed back, the changes made under the other name are captured as its own."""
    pub = ctx.publication
    if pub is None or pub.all_tables:
        return None
    unnamed = sorted(pub.tables - set(ctx.tables) - {ctx.signal_table})
    if len(unnamed) != 1:
        return None
    (other,) = unnamed
    back = []
    if other.schema != t.schema:
        move = "ALTER TABLE {} SET SCHEMA {};"
        back.append(ctx.render(move, table_id(other), sql.Identifier(t.schema)))
    if other.name != t.name:
        moved = table_id(TableName(t.schema, other.name))
        back.append(ctx.render("ALTER TABLE {} RENAME TO {};", moved, sql.Identifier(t.name)))
    detail = (
        f"{t} does not exist; publication {quoted(pub.name)} publishes {other}, which "
        f"source.tables does not name: {t} renamed or moved to it?"
    )
    fix = (
        f"{' '.join(back)} (its changes made meanwhile are then captured as {t}'s); or "
        f"{ctx.pipeline_file}: source.tables: write {other} instead of {t} (a new table: "
        "snapshotted, with a mirror of its own)"
    )
    return Check(f"table {t}", "fail", detail, fix)


def signal_table(ctx: Context) -> list[Check]:
    """The signal table is read (never written) at the start of every run."""
    t = ctx.signal_table
    if t is None:
        return []
    name, info = "signal_table", catalog.table_info(ctx.conn, [t])[t]
    if info is None:
        fix = f"{signal_table_ddl(t)}\nor {ctx.pipeline_file}: snapshot.signal.data.collection"
        return [Check(name, "fail", f"{t} does not exist", fix)]
    fixes = _read_grants(ctx, t, info)
    if fixes:
        detail = f"{quoted(ctx.role.name)} cannot read {t}"
        return [Check(name, "fail", detail, "\n".join(fixes))]
    return [Check(name, "pass", f"{t}, SELECT granted")]
