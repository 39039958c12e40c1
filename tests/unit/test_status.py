"""`cdc status` without a server or Spark: the Delta log reader, the lake's state, both forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_core import status as st
from cdc_core.config import load_pipeline
from cdc_core.delta_log import (
    DeltaLogError,
    newest_metadata,
    newest_record,
    newest_version,
    read_table,
    rows_by_partition,
)
from cdc_core.errors import ConfigError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.metrics import batches_file
from cdc_core.run_lock import Holder
from cdc_core.stager import StagedFile
from cdc_core.state import Retirement, snapshots_dir

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=timezone.utc)


def add(
    path: str, records: int | None, dv: int | None = None, dv_id: str = "a"
) -> dict[str, object]:
    action: dict[str, object] = {"path": path, "size": 1, "dataChange": True}
    if records is not None:
        action["stats"] = json.dumps({"numRecords": records, "minValues": {}})
    if dv is not None:
        action["deletionVector"] = {"storageType": "u", "pathOrInlineDv": dv_id, "offset": 1,
                                    "sizeInBytes": 30, "cardinality": dv}  # fmt: skip
    return action


def commit(table: Path, version: int, *actions: dict[str, object], metadata: object = None) -> None:
    """One JSON commit file, as Delta writes it: commitInfo first, then one action a line."""
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    info: dict[str, object] = {"timestamp": 1_700_000_000_000 + version, "operation": "WRITE"}
    if metadata is not None:
        info["userMetadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
    lines = [{"commitInfo": info}, *actions]
    if version == 0:
        lines[1:1] = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}},
                      {"metaData": {"id": "t", "partitionColumns": []}}]  # fmt: skip
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")


def test_rows_are_the_live_files_records_less_the_rows_their_deletion_vectors_remove(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 10)}, {"add": add("b.parquet", 5)})
    commit(tmp_path, 1, {"add": add("c.parquet", 7, dv=2)}, {"remove": add("b.parquet", 5)})

    state = read_table(tmp_path)

    assert state is not None
    assert (state.version, state.files, state.rows) == (1, 2, 10 + 7 - 2)


def test_a_deletion_vector_replaced_in_one_commit_keeps_the_file_live(tmp_path: Path) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 50, dv=10, dv_id="old")})
    # Delta writes the new add before the remove of the same path with the old vector
    commit(tmp_path, 1, {"add": add("a.parquet", 50, dv=16, dv_id="new")},
           {"remove": add("a.parquet", 50, dv=10, dv_id="old")})  # fmt: skip

    state = read_table(tmp_path)

    assert state is not None
    assert (state.files, state.rows) == (1, 34)


def test_the_newest_checkpoint_and_the_commits_after_it_make_the_table(tmp_path: Path) -> None:
    commit(tmp_path, 2, {"add": add("late.parquet", 4)})
    log = tmp_path / "_delta_log"
    adds = [add("x.parquet", 100, dv=1), add("y.parquet", 20), None]  # None: a non-add row
    dv = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()),
                    ("offset", pa.int32()), ("sizeInBytes", pa.int32()),
                    ("cardinality", pa.int64())])  # fmt: skip
    kind = pa.struct([("path", pa.string()), ("size", pa.int64()), ("dataChange", pa.bool_()),
                      ("stats", pa.string()), ("deletionVector", dv)])  # fmt: skip
    pq.write_table(pa.table({"add": pa.array(adds, kind)}), log / f"{1:020d}.checkpoint.parquet")
    (log / "_last_checkpoint").write_text('{"version": 1, "size": 3}')

    state = read_table(tmp_path)  # commits 0 and 1 are gone: only the checkpoint has them

    assert state is not None
    assert (state.version, state.files, state.rows) == (2, 3, 99 + 20 + 4)


def test_commits_that_do_not_follow_the_checkpoint_are_an_error(tmp_path: Path) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 1)})
    commit(tmp_path, 2, {"add": add("b.parquet", 1)})

    with pytest.raises(DeltaLogError, match=r"commits 0\.\.2 do not follow from version 0"):
        read_table(tmp_path)


def test_a_file_without_statistics_makes_the_row_count_unknown(tmp_path: Path) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 3)}, {"add": add("b.parquet", None)})

    state = read_table(tmp_path)

    assert state is not None
    assert state.rows is None


def test_a_folder_without_a_log_is_no_table(tmp_path: Path) -> None:
    assert read_table(tmp_path / "silver" / "public" / "t") is None


def test_the_newest_commit_recording_the_key_wins_and_other_metadata_is_skipped(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 0, metadata={"silver_applied": [100, 1]})
    commit(tmp_path, 1, metadata={"silver_applied": [200, 3]})
    commit(tmp_path, 2, metadata="not JSON, someone else's")
    commit(tmp_path, 3, metadata={"other": 1})
    commit(tmp_path, 4)

    assert newest_metadata(tmp_path, "silver_applied") == {"silver_applied": [200, 3]}
    assert newest_metadata(tmp_path, "bronze_staged_end") is None


def test_the_newest_version_starts_at_a_lagging_checkpoint_hint_and_probes_forward(
    tmp_path: Path,
) -> None:
    for version in range(14):
        commit(tmp_path, version)
    log = tmp_path / "_delta_log"
    (log / "_last_checkpoint").write_text(json.dumps({"version": 5, "size": 1}))
    for version in range(5):  # cleaned up: only the hint leads past the gap
        (log / f"{version:020d}.json").unlink()

    assert newest_version(tmp_path) == 13


def test_the_newest_version_lists_the_log_without_a_usable_hint(tmp_path: Path) -> None:
    for version in range(3):
        commit(tmp_path, version)
    (tmp_path / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 9}))

    assert newest_version(tmp_path) == 2
    assert newest_version(tmp_path / "nothing") is None


def test_a_record_counts_the_commits_after_it_and_the_search_stops_at_its_depth(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 0, metadata={"bronze_staged_end": "0/10"})
    for version in range(1, 6):
        commit(tmp_path, version, metadata={"other": version})

    assert newest_record(tmp_path, "bronze_staged_end") == (5, {"bronze_staged_end": "0/10"})
    assert newest_record(tmp_path, "bronze_staged_end", depth=5) is None


def test_the_search_ends_at_a_commit_already_cleaned_up(tmp_path: Path) -> None:
    commit(tmp_path, 0, metadata={"silver_applied": [1, 1]})
    commit(tmp_path, 1)
    commit(tmp_path, 2)
    (tmp_path / "_delta_log" / f"{0:020d}.json").unlink()
    (tmp_path / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 1}))

    assert newest_record(tmp_path, "silver_applied") is None


def test_a_silver_table_shows_its_rows_and_the_last_applied_position(tmp_path: Path) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 12)}, metadata={"silver_applied": [0x16B3748, 5]})

    shown = st.table_status("public.orders", tmp_path, st.SILVER_WATERMARK)

    assert shown == st.TableStatus("public.orders", "created", 12, 0, "0/16B3748", 5)


def test_bronze_shows_its_staged_end_and_a_missing_table_is_not_yet_created(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 0, {"add": add("a.parquet", 3)}, metadata={"bronze_staged_end": "0/1A2B"})

    bronze = st.table_status("bronze", tmp_path, st.BRONZE_WATERMARK)
    missing = st.table_status("public.x", tmp_path / "nope", st.SILVER_WATERMARK)

    assert (bronze.rows, bronze.staged_end) == (3, "0/1A2B")
    assert missing == st.TableStatus("public.x", "not_created")


def test_a_broken_log_is_a_table_line_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / f"{0:020d}.json").write_text("{not json\n")

    shown = st.table_status("public.t", tmp_path, st.SILVER_WATERMARK)

    assert shown.state == "unreadable"
    assert "00000000000000000000.json:1: not a JSON action" in str(shown.error)


def test_the_last_complete_line_of_batches_jsonl_is_the_last_batch(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    lake.state.mkdir()
    first = {"batch": 1, "ended_at": "2025-06-01T10:00:00Z", "changes": 5}
    second = {"batch": 2, "started_at": "2025-06-01T11:00:00Z", "ended_at": "2025-06-01T11:00:04Z",
              "seconds": 4.2, "lsn_from": "0/16B0000", "lsn_to": None, "changes": 120,
              "freshness_p50_s": 1.5, "freshness_p99_s": 2, "freshness_max_s": "fast"}  # fmt: skip
    batches_file(lake).write_text(
        f"{json.dumps(first)}\n{json.dumps(second)}\n" + '{"batch": 3, "ended'
    )  # the third line is still being written

    batch = st.read_last_batch(lake)

    assert batch == st.BatchStatus(
        2, "2025-06-01T11:00:00Z", "2025-06-01T11:00:04Z", 4.2, "0/16B0000", None, 120, None,
        1.5, 2.0, None,
    )  # fmt: skip
    assert st.idle_seconds(batch, NOW) == 3600 - 4


def test_no_batches_file_is_no_last_batch(tmp_path: Path) -> None:
    assert st.read_last_batch(Lake(str(tmp_path))) is None
    assert st.idle_seconds(None, NOW) is None


def test_only_staged_files_past_the_bronze_watermark_are_pending(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    lake.changes.mkdir(parents=True)
    for start, end, size in ((0x100, 0x200, 10), (0x300, 0x400, 20), (0x500, 0x600, 30)):
        name = str(StagedFile(Lsn(start), Lsn(end)))
        (lake.changes / name).write_bytes(b"x" * size)
    (lake.changes / "notes.txt").write_text("not a staged file")

    assert st.pending_files(lake, str(Lsn(0x200))) == st.PendingStatus(2, 50)
    assert st.pending_files(lake, None) == st.PendingStatus(3, 60)
    assert st.pending_files(Lake(str(tmp_path / "empty")), None) == st.PendingStatus(0, 0)


def sample(**changes: object) -> st.PipelineStatus:
    status = st.PipelineStatus(
        pipeline="orders", env="local", checked_at="2025-06-01T12:00:00Z", lake="/lake/orders",
        source=st.SourceStatus(True),
        slot=st.SlotStatus("orders_cdc", True, False, None, "reserved", "0/16B3748", "0/16B3710",
                           56, None),
        last_batch=st.BatchStatus(7, "2025-06-01T11:57:00Z", "2025-06-01T11:57:04Z", 4.2,
                                  "0/16B0000", "0/16B3748", 1234, 57, 1.25, 2.5, 3.5),
        idle_s=176.0, stale_after_s=3600.0,
        bronze=st.TableStatus("bronze", "created", 5678, 9, staged_end="0/16B3748"),
        tables=(st.TableStatus("public.orders", "created", 200, 4, "0/16B3748", 5),
                st.TableStatus('public."Order Items"', "not_created")),
        snapshots=(st.SnapshotStatus("20250601T100000-initial-ab12cd", "initial", 1, 2, 650,
                                     False),),
        pending=st.PendingStatus(2, 3 * 1024 * 1024),
    )  # fmt: skip
    return replace(status, **changes)  # type: ignore[arg-type]


def test_the_human_form_is_labelled_lines_then_a_table_of_tables() -> None:
    assert st.format_status(sample()).splitlines() == [
        "pipeline orders (env local) at 2025-06-01T12:00:00Z",
        "lake        /lake/orders",
        "slot        orders_cdc: inactive, wal_status reserved",
        "            confirmed 0/16B3748, restart 0/16B3710, retained WAL 56 B",
        "last batch  #7 ended 2025-06-01T11:57:04Z (2 min ago)",
        "            0/16B0000..0/16B3748: 1234 changes in 57 transactions, 4.2 s",
        "            freshness p50 1.2 s, p99 2.5 s, max 3.5 s",
        "bronze      5678 rows, staged up to 0/16B3748",
        "pending     2 staged files (3.0 MiB) not yet in bronze",
        "snapshots   20250601T100000-initial-ab12cd  initial      1/2 tables  650 rows  in progress",
        "",
        "table                 rows  applied up to",
        "public.orders          200  0/16B3748 #5",
        'public."Order Items"     -  not yet created',
        "",
        "ok",
    ]


def test_a_position_from_a_snapshot_read_says_so() -> None:
    read = st.TableStatus("public.orders", "created", 250, 1, "0/192EEE8", -1)

    assert st.format_status(sample(tables=(read,))).splitlines()[12] == (
        "public.orders   250  0/192EEE8 (snapshot read)"
    )


STORED = {"slot": "orders_cdc", "confirmed": "0/16B3748", "system": "7712834643800892727"}


def test_a_source_that_is_another_cluster_is_a_problem() -> None:
    """A source whose system identifier is not the one the lake's position was recorded on
    (pg_upgrade, a restored dump, source.dsn pointed elsewhere): its slot cannot hold the
    position, whatever its own looks like; the next run stops, and status says why first."""
    moved = sample(source=st.SourceStatus(True, system_identifier="7712834676626605414"))

    problems = st._problems(moved, STORED)

    assert problems == [
        "the source is another database cluster (system identifier 7712834676626605414) than "
        "the one the pipeline read (the lake's 7712834643800892727): its slot cannot hold the "
        "lake's position; the next run stops, see docs/runbooks.md, runbooks 1 and 4"
    ]
    same = sample(source=st.SourceStatus(True, system_identifier="7712834643800892727"))
    unknown = sample(source=st.SourceStatus(True))  # a role pg_control_system() refuses
    older = {"slot": "orders_cdc", "confirmed": "0/16B3748"}  # recorded before identifiers
    assert st._problems(same, STORED) == st._problems(unknown, STORED) == []
    assert st._problems(moved, older) == []


def test_a_slot_confirmed_past_the_stored_position_is_a_problem() -> None:
    """A lake restored from an older backup, or a slot recreated: every run stops on it
    (`start.holds_position`), and status says so first instead of ok."""
    ahead = sample(slot=replace(sample().slot, confirmed_flush_lsn="0/16B4000"))

    (problem,) = st._problems(ahead, STORED)

    assert problem.startswith(
        "slot orders_cdc is confirmed up to 0/16B4000, past the lake's stored position "
        "0/16B3748: changes between them never reached the lake"
    )
    assert problem.endswith("see docs/runbooks.md, runbook 7")
    assert st._problems(sample(), STORED) == []  # at the stored position
    behind = sample(slot=replace(sample().slot, confirmed_flush_lsn="0/16B0000"))
    assert st._problems(behind, STORED) == []  # a run confirms after it records
    other = {**STORED, "slot": "renamed"}  # start stops on that, saying why
    assert st._problems(ahead, other) == st._problems(ahead, None) == []


def test_a_missing_slot_exits_1_with_the_way_out() -> None:
    status = sample(slot=st.SlotStatus("orders_cdc", exists=False))
    status = replace(status, problems=tuple(st._problems(status, STORED)))

    text = st.format_status(status)

    assert status.exit_code == 1
    assert "slot        orders_cdc: MISSING" in text
    assert "problem: slot orders_cdc does not exist (dropped?)" in text
    assert "snapshot.mode when_needed" in text
    assert not text.endswith("ok")


def test_a_lost_slot_and_a_stale_pipeline_are_problems() -> None:
    status = sample(slot=replace(sample().slot, wal_status="lost"), idle_s=7500.0)

    problems = st._problems(status, STORED)

    assert status.stale
    assert [p.split(":")[0] for p in problems] == [
        "slot orders_cdc lost WAL it needed (wal_status lost)",
        "the pipeline has not run for 2 h 5 min (more than --stale-after 3600 s)",
    ]


def test_a_run_under_way_that_makes_progress_is_not_stale() -> None:
    """One batch of a long snapshot: no batch has ended for hours, but the run saves its
    progress after every group it reads."""
    running = "pid 4242 on host etl-1, started 2025-06-01T09:00:00+00:00"
    busy = sample(idle_s=7500.0, running=running, progress_s=120.0)

    assert not busy.stale
    assert st._problems(busy, STORED) == []
    assert "run         under way: " + running in st.format_status(busy).splitlines()

    stuck = replace(busy, progress_s=7000.0)
    assert stuck.stale
    assert st._problems(stuck, STORED) == [
        f"the run under way ({running}) has made no progress for 116 min, and no batch "
        "ended for 2 h 5 min (more than --stale-after 3600 s)"
    ]
    assert not sample(idle_s=None, running=running, progress_s=7000.0).stale  # never ran one


def test_progress_is_the_run_s_start_or_its_newest_snapshot_job_save(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    holder = Holder("etl-1", 4242, "orders", "2025-06-01T09:00:00+00:00", "ingest")
    now = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
    assert st._progress_seconds(lake, holder, now) == 3 * 3600.0
    jobs = snapshots_dir(lake)
    jobs.mkdir(parents=True)
    saved = jobs / "20250601T090000-initial-ab12cd.json"
    saved.write_text("{}")
    then = now.timestamp() - 90
    os.utime(saved, (then, then))
    assert st._progress_seconds(lake, holder, now) == 90.0


def test_an_unreachable_source_exits_75_and_the_lake_is_still_shown() -> None:
    status = sample(source=st.SourceStatus(False, "cannot connect to PostgreSQL at x: refused"),
                    slot=st.SlotStatus("orders_cdc"))  # fmt: skip
    status = replace(status, problems=tuple(st._problems(status, STORED)))

    text = st.format_status(status)

    assert status.exit_code == 75
    assert "slot        orders_cdc: unknown, the source is unreachable" in text
    assert "public.orders          200  0/16B3748 #5" in text
    assert "problem: source unreachable: cannot connect to PostgreSQL at x: refused" in text


def test_a_source_that_refuses_the_login_exits_1_not_75() -> None:
    refused = st.SourceStatus(False, "password authentication failed", lasting=True)
    status = sample(source=refused, slot=st.SlotStatus("orders_cdc"))

    assert status.exit_code == 1


def test_a_retired_pipeline_is_healthy_without_its_slot_and_its_runs() -> None:
    """After cdc retire no slot and no run are expected; a slot made again is a problem (it pins
    WAL nobody reads), and so is a retirement cut short before the slot was dropped."""
    retired = Retirement("2025-06-01T12:00:00Z", "orders_cdc", "0/16B3748", done=True)
    gone = sample(slot=st.SlotStatus("orders_cdc", exists=False), idle_s=9e6, retired=retired)

    assert st._retired_problems(gone, retired) == []
    assert gone.exit_code == 0
    text = st.format_status(gone).splitlines()
    assert text[2:4] == [
        "retired     retired at 2025-06-01T12:00:00Z by cdc retire (its slot orders_cdc dropped "
        "at 0/16B3748)",
        "slot        orders_cdc: dropped (retired)",
    ]
    made_again = replace(gone, slot=sample().slot)
    assert st._retired_problems(made_again, retired) == [
        "slot orders_cdc exists, though pipeline orders was retired at 2025-06-01T12:00:00Z by "
        "cdc retire (its slot orders_cdc dropped at 0/16B3748): it holds WAL no run reads; drop "
        "it: cdc retire --pipeline orders --yes"
    ]
    cut_short = replace(retired, done=False)
    assert st._retired_problems(made_again, cut_short) == [
        "pipeline orders is being retired since 2025-06-01T12:00:00Z (cdc retire was cut short: "
        "run it again with --yes to finish dropping slot orders_cdc)"
    ]


def test_the_json_form_has_stable_snake_case_keys() -> None:
    data = json.loads(st.format_json(sample()))

    assert list(data) == [
        "pipeline", "env", "checked_at", "lake", "source", "slot", "last_batch", "idle_s",
        "stale_after_s", "bronze", "tables", "snapshots", "pending", "problems", "warnings",
        "retired", "running", "progress_s", "stale", "healthy", "exit_code",
    ]  # fmt: skip
    assert data["slot"] == {
        "name": "orders_cdc", "exists": True, "active": False, "active_pid": None,
        "wal_status": "reserved", "confirmed_flush_lsn": "0/16B3748", "restart_lsn": "0/16B3710",
        "retained_wal_bytes": 56, "safe_wal_size_bytes": None, "unusable": None,
        "reader": None, "foreign_reader": False, "held_by": None,
    }  # fmt: skip
    assert data["tables"][0] == {
        "table": "public.orders", "state": "created", "rows": 200, "version": 4,
        "applied_lsn": "0/16B3748", "applied_seq": 5, "staged_end": None, "error": None,
        "dead_letters": 0,
        "dropped": None,
    }  # fmt: skip
    assert data["tables"][1]["state"] == "not_created"
    assert data["last_batch"]["freshness_max_s"] == 3.5
    assert data["pending"] == {"files": 2, "bytes": 3 * 1024 * 1024}
    assert (data["stale"], data["healthy"], data["exit_code"]) == (False, True, 0)
    assert data["retired"] is None


def write_pipeline(home: Path, source: str) -> None:
    """Pipeline `p` capturing public.t into home/lake; `source`: its source keys, one a line."""
    (home / "pipelines").mkdir()
    (home / "conf").mkdir()
    (home / "conf" / "local.yaml").write_text("spark:\n  master: local[1]\n")
    keys = "".join(f"  {line}\n" for line in [*source.splitlines(), "tables: [public.t]"])
    (home / "pipelines" / "p.yaml").write_text(
        f"name: p\nsource:\n{keys}target:\n  root: {home / 'lake'}\n"
    )


def test_status_of_a_pipeline_whose_server_is_down_reads_the_lake(tmp_path: Path) -> None:
    write_pipeline(
        tmp_path, "dsn: postgresql://postgres@127.0.0.1:1/shop\nslot: p_cdc\npublication: p_cdc"
    )
    config = load_pipeline("p", "local", home=tmp_path, environ={})
    commit(Path(Lake(config.pipeline.target.root).bronze), 0, {"add": add("a.parquet", 9)},
           metadata={"bronze_staged_end": "0/10"})  # fmt: skip

    status = st.gather_status(config, now=NOW)

    assert status.exit_code == 75
    assert "127.0.0.1" in str(status.source.error)
    assert (status.bronze.rows, status.bronze.staged_end) == (9, "0/10")
    assert status.tables == (st.TableStatus("public.t", "not_created"),)
    assert (status.last_batch, status.stale, status.snapshots) == (None, False, ())


def test_each_damaged_state_document_is_a_problem_and_none_stops_the_status(
    tmp_path: Path,
) -> None:
    """Each stops the next run; status read past them all (the stream position, the record of
    dropped tables, the retirement and the known tables among them) and named each."""
    write_pipeline(
        tmp_path, "dsn: postgresql://postgres@127.0.0.1:1/shop\nslot: p_cdc\npublication: p_cdc"
    )
    config = load_pipeline("p", "local", home=tmp_path, environ={})
    state = Lake(config.pipeline.target.root).state
    state.mkdir(parents=True)
    names = ["dropped.json", "retired.json", "stream.json", "tables.json"]
    for name in names:
        (state / name).write_text("[")
    (state / "pipeline.json").write_text('{"pipeline": "q"}')  # another pipeline's lake

    status = st.gather_status(config, now=NOW)

    assert [p.split(" ")[0] for p in status.problems] == [
        "source", *(str(state / n) for n in ["stream.json", "dropped.json", "retired.json",
                                              "tables.json"]), "target.root",
    ]  # fmt: skip
    assert status.problems[-1].startswith(f"target.root {state.parent} holds the lake of "
                                          "pipeline 'q', not 'p'")  # fmt: skip
    assert "is not a stream position record" in status.problems[1]
    assert status.problems[2].endswith("is not valid JSON (Expecting value: line 1 column 2 "
                                       "(char 1)): restore it or remove it")  # fmt: skip
    assert (status.retired, status.exit_code) == (None, 75)  # the source is down: try again


def test_the_watermark_keys_are_the_stages_own() -> None:
    from cdc_core import bronze, silver

    assert (st.BRONZE_WATERMARK, st.SILVER_WATERMARK) == (bronze.WATERMARK, silver.WATERMARK)


def test_status_never_imports_pyspark() -> None:
    code = "import sys, cdc_core.status, cdc_core.cli; sys.exit('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


SOURCE = "dsn: host=127.0.0.1 dbname=x\nslot: s\npublication: pub"


def test_retained_wal_past_the_thresholds_warns_then_fails_with_the_way_out() -> None:
    gib = 1 << 30
    assert st.retained_wal_verdict("s", 2 * gib, warn=0, fail=0) is None
    assert st.retained_wal_verdict("s", None, warn=1, fail=2) is None
    assert st.retained_wal_verdict("s", gib, warn=gib, fail=4 * gib) is None  # not above
    warn = st.retained_wal_verdict("s", 2 * gib, warn=gib, fail=4 * gib)
    assert warn is not None
    assert warn[0] == "warn"
    assert "retains 2.0 GiB" in warn[1]
    assert "retained_wal_warn (1.0 GiB)" in warn[1]
    fail = st.retained_wal_verdict("s", 5 * gib, warn=gib, fail=4 * gib)
    assert fail is not None
    assert fail[0] == "fail"
    assert "pg_drop_replication_slot('s')" in fail[1]
    assert "when_needed" in fail[1]


def test_status_reports_retained_wal_past_the_fail_threshold_as_a_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_pipeline(tmp_path, f"{SOURCE}\nretained_wal_warn: 1MiB\nretained_wal_fail: 8MiB")
    config = load_pipeline("p", "local", home=tmp_path)
    slot = st.SlotStatus("s", True, False, None, "extended", "0/10", "0/10", 9 << 20, None)
    monkeypatch.setattr(st, "read_slot", lambda dsn, name: (st.SourceStatus(True), slot))

    status = st.gather_status(config)

    assert any("retained_wal_fail (8.0 MiB)" in p for p in status.problems)
    assert status.exit_code != 0
    slot = replace(slot, retained_wal_bytes=2 << 20)
    assert any("retained_wal_warn" in w for w in st.gather_status(config).warnings)


def test_a_fail_threshold_must_be_above_the_warning(tmp_path: Path) -> None:
    write_pipeline(tmp_path, f"{SOURCE}\nretained_wal_fail: 512MiB")
    with pytest.raises(ConfigError, match=r"retained_wal_fail.*not above retained_wal_warn"):
        load_pipeline("p", "local", home=tmp_path)


def test_rows_per_partition_come_from_the_live_files(tmp_path: Path) -> None:
    def part(path: str, records: int, table: str) -> dict[str, object]:
        return add(path, records) | {"partitionValues": {"source_table": table}}

    commit(tmp_path, 0, {"add": part("a.parquet", 2, "public.a")},
           {"add": part("b.parquet", 1, "public.b")})  # fmt: skip
    commit(tmp_path, 1, {"add": part("c.parquet", 3, "public.a")},
           {"remove": {"path": "b.parquet"}})  # fmt: skip

    assert rows_by_partition(tmp_path, "source_table") == {"public.a": 5}
    assert rows_by_partition(tmp_path / "nope", "source_table") is None


def test_a_table_with_dead_letters_says_how_many() -> None:
    held = st.TableStatus("public.orders", "created", 200, 4, "0/16B3748", 5, dead_letters=3)

    assert st.format_status(sample(tables=(held,))).splitlines()[12] == (
        "public.orders   200  0/16B3748 #5; 3 in _state/dead_letters"
    )


def test_a_table_dropped_at_the_source_says_whether_its_last_changes_are_applied() -> None:
    lines = st.TableStatus("public.lines", "created", 19, 6, "0/16B3748", 2, dropped="applied")
    items = st.TableStatus("public.items", "created", 7, 2, "0/16B3700", 0, dropped="following")

    text = st.format_status(sample(tables=(lines, items))).splitlines()
    assert (
        text[12]
        == "public.lines    19  0/16B3748 #2; dropped at the source, its last changes applied"
    )
    assert text[13] == (
        "public.items     7  0/16B3700 #0; dropped at the source, its last changes not all applied yet"
    )


def test_dead_letters_are_counted_per_table_and_none_without_the_table(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path))
    assert st.read_dead_letters(lake) == {}
    part = add("a.parquet", 2) | {"partitionValues": {"source_table": "public.periods"}}
    commit(tmp_path / "_state" / "dead_letters", 0, {"add": part})

    assert st.read_dead_letters(lake) == {"public.periods": 2}
