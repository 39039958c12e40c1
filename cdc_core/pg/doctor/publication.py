"""The doctor's check of the pipeline's publication: the one there (operations, missing tables,
who may add them, partitions, row filters and column lists) or, when there is none, whether the
role may create it."""

from __future__ import annotations

from psycopg import sql

from cdc_core.identifiers import TableName
from cdc_core.pg.doctor.context import SHARED_OWNERSHIP, Context, quoted
from cdc_core.pg.doctor.report import Check
from cdc_core.pg.slot import VIA_ROOT, published

OPERATIONS = {"c": "insert", "u": "update", "d": "delete", "t": "truncate"}
"""skipped.operations codes and the publication's publish operations they stand for."""


def _names(tables: list[TableName]) -> str:
    return ", ".join(str(t) for t in tables)


def publication(ctx: Context) -> Check:
    pub = ctx.publication
    if pub is None:
        return _publication_to_create(ctx)
    pub_id, present = sql.Identifier(pub.name), ctx.present
    missing = [i.name for i in present if not pub.all_tables and i.name not in pub.tables]
    detail = f"{quoted(pub.name)} publishes {len(present) - len(missing)} of {len(present)} tables"
    detail += " (FOR ALL TABLES)" if pub.all_tables else ""
    problems, fixes = [], []
    skipped = ctx.source.skipped_operations.codes
    wanted = [op for code, op in OPERATIONS.items() if code not in skipped]
    absent = [op for op in wanted if op not in pub.operations]
    if absent:
        problems.append(f"it does not publish {', '.join(absent)}: those changes would never "
                        "reach the mirrors, which would then differ from the source")  # fmt: skip
        publish = "ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate');"
        fixes.append(ctx.render(publish, pub_id))
        leave = ",".join(c for c, op in OPERATIONS.items() if c in skipped or op in absent)
        fixes.append(f"or leave them out of the mirrors: {ctx.pipeline_file}: "
                     f"source.skipped.operations: {leave}")  # fmt: skip
    problems_of_rows, refresh = _partly_published(ctx, pub_id)
    problems += problems_of_rows
    fixes += refresh
    # Only missing tables make the product run ALTER PUBLICATION ... ADD TABLE (and only under
    # publication.autocreate.mode filtered), which needs ownership of the publication and of
    # each table it adds (PostgreSQL 15). The other modes stop the run
    # (`start_publication.unpublished`).
    mode = ctx.source.publication_autocreate_mode
    not_owned = [i.name for i in present if i.name in missing and not i.is_owner]
    if missing and mode != "filtered":
        problems.append(
            f"publication.autocreate.mode {mode} adds no table to an existing publication: "
            f"a run stops until {_names(missing)} {'is' if len(missing) == 1 else 'are'} added"
        )
        add = ctx.render("ALTER PUBLICATION {} ADD TABLE {};", pub_id,
                         published(missing))  # fmt: skip
        fixes += [add, f"(run as {quoted(pub.owner)} if it owns those tables, or as a superuser)"]
    elif missing and (not pub.is_owner or not_owned):
        owners = f"the publication ({quoted(pub.owner)}) and of the tables"
        problems.append(
            f"{quoted(ctx.role.name)} cannot add {_names(missing)}: only the owner of {owners} can"
        )
        add = ctx.render("ALTER PUBLICATION {} ADD TABLE {};", pub_id,
                         published(missing))  # fmt: skip
        fixes += [add, f"(run as {quoted(pub.owner)} if it owns those tables, or as a superuser)"]
    partitioned = [i.name for i in present if i.kind == "partitioned"]
    if partitioned and not pub.via_root:
        problems.append(
            f"it sends the changes of partitioned table {_names(partitioned)} under its "
            "partitions' names (publish_via_partition_root is off): the pipeline would miss them"
        )
        via_root = "ALTER PUBLICATION {} SET (publish_via_partition_root = true);"
        fixes.append(ctx.render(via_root, pub_id))
    if problems:
        unpublished = bool(missing) and mode != "filtered"
        return Check("publication", "fail", "; ".join([detail, *problems]), "\n".join(fixes),
                     left_to_start=unpublished)  # fmt: skip
    if missing:
        detail += "; the product adds the others (ALTER PUBLICATION ... ADD TABLE)"
    elif not pub.is_owner:
        detail += f"; used as it is (owner {quoted(pub.owner)})"
    return Check("publication", "pass", detail)


def _partly_published(ctx: Context, pub_id: sql.Identifier) -> tuple[list[str], list[str]]:
    """What a row filter or column list (PostgreSQL 15+) on a captured table would do to its
    mirror, and the fix: the table published whole, taken out and added back in one transaction
    (no change goes unsent), which a run then snapshots again as a table published anew (its
    `pg_publication_rel` row is new), so a mirror fed through the filter comes back in line."""
    assert ctx.publication is not None
    problems, partial = [], []
    for info in ctx.present:
        table, where = info.name, ctx.publication.row_filter(info.name)
        columns = ctx.publication.column_list(info.name)
        if where is not None:
            problems.append(
                f"it publishes only the rows of {table} WHERE {where}: a snapshot reads them all, "
                "and a row the condition leaves out would keep the values it was read with"
            )
        if columns is not None:
            problems.append(
                f"it publishes only columns {', '.join(columns)} of {table}: the mirror would "
                "not keep the others up to date"
            )
        if where is not None or columns is not None:
            partial.append(table)
    whole = [ctx.render("BEGIN; ALTER PUBLICATION {} DROP TABLE {}; ALTER PUBLICATION {} ADD TABLE "
                        "{}; COMMIT;", pub_id, published([t]), pub_id, published([t]))
             for t in partial]  # fmt: skip
    if whole:
        whole.append("(the next run snapshots each table published anew, as a mirror a run fed "
                     "through the filter needs)")  # fmt: skip
    return problems, whole


def _publication_to_create(ctx: Context) -> Check:
    name, present = ctx.source.publication, ctx.present
    not_owned = [i for i in present if not i.is_owner]
    if ctx.database.can_create and not not_owned:
        return Check("publication", "pass", f"{quoted(name)} does not exist; it will be created")
    create = ctx.render("CREATE PUBLICATION {} FOR TABLE {} {};", sql.Identifier(name),
                        published([i.name for i in present]), VIA_ROOT)  # fmt: skip
    if not_owned:
        why = f"not owner of {_names([i.name for i in not_owned])}"
        owners = ", ".join(sorted({quoted(i.owner) for i in not_owned}))
        fix = f"{create}\n(run as a superuser or as the tables' owner: {owners})"
        fix += f"\n{SHARED_OWNERSHIP}"
    else:
        why = f"no CREATE on database {quoted(ctx.database.name)}"
        fix = ctx.render("GRANT CREATE ON DATABASE {} TO {};",
                         sql.Identifier(ctx.database.name), ctx.role_id)  # fmt: skip
        fix += f"\nor, as the tables' owner: {create}"
    detail = f"{quoted(name)} does not exist and {quoted(ctx.role.name)} cannot create it: {why}"
    return Check("publication", "fail", detail, fix)
