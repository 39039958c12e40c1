"""Snapshot reads planned before a schema change that the table no longer takes.

A snapshot (initial, incremental or blocking) keeps its chunks' key, the key's types and its
condition from when it was planned, and a run may resume it after a schema change (a snapshot
killed or paused, then the key column renamed or retyped, or a column its condition names
renamed). Its next read would fail, and so every run after it, for every table. A run's start
tries each unfinished table's remaining reads on the server (EXPLAIN: planned, not run): a
condition the table no longer takes gives that table's read up, with a warning, as a signal
whose condition cannot be read is not carried out; chunks it no longer takes are planned
again, over the table's key now, in a snapshot of their own that reads the table whole again.
"""

from __future__ import annotations

import logging

import psycopg

from cdc_core.config import Config
from cdc_core.errors import first_line
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.notifications import NotificationType, Notifier
from cdc_core.pg.catalog import own_rows
from cdc_core.snapshot import Kind, SnapshotJob, TableSnapshot, plan_job, planning_error
from cdc_core.snapshot_plan import chunk_predicate

log = logging.getLogger("cdc_core.start")

Conn = psycopg.Connection[tuple[object, ...]]


def replan_stale_reads(
    conn: Conn, config: Config, lake: Lake, jobs: list[SnapshotJob]
) -> list[SnapshotJob]:
    """Give up, or plan again, the unfinished snapshot reads the tables no longer take (saved);
    the new jobs that read them again (of the same kind: an initial snapshot stays unfinished
    until the new job has read its tables)."""
    again: dict[Kind, list[TableSnapshot]] = {}
    wait = config.pipeline.snapshot.lock_timeout_ms
    for job in jobs:
        if job.finished:
            continue
        changed = []
        for part in job.tables:
            if part.done or not _exists(conn, part.table):
                continue  # a table dropped since ends its read by itself
            problem = _refused(conn, part, condition_only=False, lock_wait_ms=wait)
            if problem is None:
                continue
            given_up = _refused(conn, part, condition_only=True, lock_wait_ms=wait)
            if given_up is not None:
                log.warning(
                    "snapshot %s: %s is not read any further: its %s no longer reads (%s), "
                    "after a schema change since it was planned", job.id, part.table,
                    "SELECT" if part.select else "condition", given_up,
                )  # fmt: skip
            else:
                log.warning(
                    "snapshot %s: %s changed since its chunks were planned (%s): it is read "
                    "again, in chunks planned over its key now", job.id, part.table, problem,
                )  # fmt: skip
                again.setdefault(job.kind, []).append(part)
            job.end(part, "its condition no longer reads after a schema change" if given_up
                    else "read again by a job planned over its key now")  # fmt: skip
            changed.append(part.table)
        if changed:
            Notifier.of(config.pipeline, lake).job(job, NotificationType.ABORTED,
                                                   collections=changed)  # fmt: skip
            job.save(lake)
    return [_plan_again(conn, config, lake, kind, parts) for kind, parts in again.items()]


def _plan_again(
    conn: Conn, config: Config, lake: Lake, kind: Kind, parts: list[TableSnapshot]
) -> SnapshotJob:
    settings = config.pipeline.snapshot
    conditions = {p.table: c for p in parts if (c := p.select or p.condition) is not None}
    job = plan_job(
        conn, kind, "planned again",
        [p.table for p in parts], chunk_size=settings.chunk_size, conditions=conditions,
        keys=config.pipeline.source.message_key_columns,
        overrides=settings.select_for if kind != "incremental" else None,
    )  # fmt: skip
    job.save(lake)
    log.info("snapshot %s planned: %s", job.id, ", ".join(str(p.table) for p in parts))
    return job


def _exists(conn: Conn, table: TableName) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (str(table),)).fetchone()
    return bool(row and row[0])


def _refused(
    conn: Conn, part: TableSnapshot, *, condition_only: bool, lock_wait_ms: int
) -> str | None:
    """Why the server refuses `part`'s remaining reads (its condition alone, with
    `condition_only`), or None: planned, not run. A table whose lock is not granted within
    `lock_wait_ms` (snapshot.lock.timeout.ms) is not checked now: its read waits for the lock
    as long, and fails saying so (a check that waited would end in the statement timeout)."""
    source = (
        f"(\n{part.query}\n) AS cdc_selected"
        if part.query
        else own_rows(conn, part.table).as_string(conn)
    )
    where = [f"(\n{part.condition}\n)"] if part.condition else []
    if not condition_only:
        chunks = part.plan.chunks
        where += [f"({chunk_predicate(part.plan, c)})" for c in (chunks[:1] + chunks[-1:])]
    if not where and condition_only and not part.select:
        return None
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    error = planning_error(conn, f"{source}{clause}", lock_wait_ms=lock_wait_ms)
    if error is None:
        return None
    if error.sqlstate == _LOCKED:  # a DDL holds the table: the read waits for it and says so
        log.info("snapshot of %s: not checked against the table now (%s)", part.table,
                 first_line(error))  # fmt: skip
        return None
    if not (error.sqlstate or "").startswith(_REFUSALS) or error.sqlstate == _NO_PRIVILEGE:
        raise error  # not the read's own SQL: a timeout, a lost connection, a revoked right
    return first_line(error)


_REFUSALS = ("42", "22")  # SQLSTATE classes: the SQL names what is not there, or mistypes it
_NO_PRIVILEGE = "42501"
_LOCKED = "55P03"
