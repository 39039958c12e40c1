"""The doctor's check of the pipeline's publication: the one there (operations, missing tables,
who may add them, partitions) or, when there is none, whether the role may create it."""

from __future__ import annotations

from psycopg import sql

from cdc_core.identifiers import TableName
from cdc_core.pg.doctor.context import SHARED_OWNERSHIP, Context, quoted
from cdc_core.pg.doctor.report import Check
from cdc_core.pg.slot import VIA_ROOT, published

REQUIRED_OPERATIONS = ("insert", "update", "delete")


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
    absent_ops = [op for op in REQUIRED_OPERATIONS if op not in pub.operations]
    if absent_ops:
        problems.append(f"it does not publish {', '.join(absent_ops)}")
        publish = "ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate');"
        fixes.append(ctx.render(publish, pub_id))
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
