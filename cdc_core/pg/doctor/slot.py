"""The doctor's check of the pipeline's replication slot: to be created, usable, or lost."""

from __future__ import annotations

from psycopg import sql

from cdc_core.pg.doctor.context import Context, quoted
from cdc_core.pg.doctor.report import Check


def slot(ctx: Context) -> Check:
    slot, name = ctx.slot, quoted(ctx.source.slot)
    if slot is None:
        return Check("slot", "pass", f"{name} does not exist yet; it will be created (pgoutput)")
    problems = []
    if slot.slot_type != "logical":
        problems.append(f"is a {slot.slot_type} slot")
    elif slot.plugin != "pgoutput":
        problems.append(f"uses plugin {slot.plugin}, not pgoutput")
    if slot.database not in (None, ctx.database.name):
        problems.append(f"belongs to database {quoted(slot.database)}")
    if problems:
        drop = ctx.render("SELECT pg_drop_replication_slot({});", sql.Literal(slot.name))
        fix = f"{drop}\nor choose another name: {ctx.pipeline_file}: source.slot"
        return Check("slot", "fail", f"{name} " + ", ".join(problems), fix)
    if slot.wal_status == "lost":  # the run decides: snapshot.mode says whether to start over
        mode = f"{ctx.pipeline_file}: snapshot.mode"
        return Check(
            "slot", "warn",
            f"{name} lost the WAL it needs (wal_status lost): changes since its position are "
            "gone from the server",
            f"{mode} when_needed (or always) takes a new slot and a new snapshot by itself; "
            "with initial or no_data the run stops",
        )  # fmt: skip
    state = f"active (pid {slot.active_pid})" if slot.active_pid is not None else "inactive"
    return Check("slot", "pass", f"{name} exists: logical, pgoutput, {state}")
