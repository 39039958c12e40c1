"""The doctor's checks of the pipeline's replication slot (to be created, usable, or lost) and of
the other slots on the server that keep WAL nobody reads."""

from __future__ import annotations

from psycopg import sql

from cdc_core.config import ByteSize
from cdc_core.pg import waits
from cdc_core.pg.doctor.context import Context, quoted
from cdc_core.pg.doctor.report import Check
from cdc_core.pg.slot import WAITS_FOR

OPEN_FOR_S = 60.0
"""A session's transaction open longer than this is named before the slot is created (a prepared
transaction is named however young: nothing ends it by itself)."""


def slot(ctx: Context) -> Check:
    slot, name = ctx.slot, quoted(ctx.source.slot)
    if slot is None:
        if held := waits.open_transactions(ctx.conn, OPEN_FOR_S, every_prepared=True):
            more = f" and {len(held) - _LISTED} more" if len(held) > _LISTED else ""
            return Check(
                "slot", "warn",
                f"{name} does not exist yet, and creating it will wait for transactions open "
                f"now to end ({WAITS_FOR}): " + "; ".join(map(str, held[:_LISTED])) + more,
                "\n".join(f"{h}: {h.way_out}" for h in held[:_LISTED]),
            )  # fmt: skip
        return Check("slot", "pass", f"{name} does not exist yet; it will be created (pgoutput)")
    if problems := slot.unusable(ctx.database.name):
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
    if slot.foreign_reader:
        reader = repr(slot.reader) if slot.reader else "unknown"
        stop = ctx.render("SELECT pg_terminate_backend({});", sql.Literal(slot.active_pid))
        return Check(
            "slot", "fail",
            f"{name} is read now by another process (pid {slot.active_pid}, application_name "
            f"{reader}), not by a run of this pipeline: a run exits 75 (to be retried) until it "
            "lets go of the slot",
            "stop that reader (a Debezium connector still attached to the slot: stop or delete "
            f"the connector); or end its session: {stop}",
            passing=True,
        )  # fmt: skip
    state = f"active (pid {slot.active_pid})" if slot.active_pid is not None else "inactive"
    return Check("slot", "pass", f"{name} exists: logical, pgoutput, {state}")


# Slots no process reads, with the WAL each keeps (from its restart_lsn to the server's WAL
# position: the replay position on a standby, which has no current one)
_IDLE_SLOTS = """
SELECT slot_name::text, slot_type, database::text,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_lsn() END, restart_lsn)::bigint
FROM pg_replication_slots
WHERE NOT active AND slot_name <> %s AND restart_lsn IS NOT NULL
ORDER BY 4 DESC, 1
"""

_LISTED = 5  # idle slots named in the warning; the rest are counted


def other_slots(ctx: Context) -> Check:
    """Other slots no process reads now that keep more WAL than source.retained_wal_warn (1 GiB
    unless set; 0: not checked): the source's disk fills whichever slot pins the WAL, and a slot
    left by a retired pipeline or a test is the classic way it happens."""
    limit = ctx.source.retained_wal_warn
    if not limit:
        return Check("other_slots", "pass", "not checked (source.retained_wal_warn is 0)")
    rows = ctx.conn.execute(_IDLE_SLOTS, (ctx.source.slot,)).fetchall()
    held = [(str(n), str(t), d, int(str(b))) for n, t, d, b in rows if int(str(b)) > limit]
    over = f"more than {limit.readable()} of WAL (source.retained_wal_warn)"
    if not held:
        return Check("other_slots", "pass", f"no other idle slot keeps {over}")
    named = [
        f"{quoted(name)} {ByteSize(size).readable()} ({kind}"
        + (f", database {quoted(database)}" if database else "") + ")"
        for name, kind, database, size in held[:_LISTED]
    ]  # fmt: skip
    more = f" and {len(held) - _LISTED} more" if len(held) > _LISTED else ""
    some = ("1 other idle slot (no process reads it now) keeps" if len(held) == 1 else
            f"{len(held)} other idle slots (no process reads them now) keep")  # fmt: skip
    drop = ctx.render("SELECT pg_drop_replication_slot({});", sql.Literal(held[0][0]))
    return Check(
        "other_slots", "warn",
        f"{some} {over}: {', '.join(named)}{more}; the server keeps that WAL until each is read "
        "or dropped",
        "a scheduled pipeline's slot: run it more often; a retired pipeline's: cdc retire "
        f"--pipeline NAME --yes; one nothing needs (a test, a tool gone): {drop} "
        "(docs/runbooks.md, runbook 2)",
    )  # fmt: skip
