"""The lake's own files on an object store: an S3 server (moto, in this process, on 127.0.0.1)
holds staged change files, state documents, batch lines and the run holder exactly as a local
directory would, and nothing is written to the local file system instead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

from cdc_core.config import load_pipeline
from cdc_core.errors import TerminalError, TransientError
from cdc_core.lake import Lake
from cdc_core.metrics import (
    batch_lines_after,
    batches_file,
    last_batch,
    prune_batch_lines,
    record_batch,
)
from cdc_core.run_lock import RunLockedError, holder_file, lock_file, read_holder, run_lock
from cdc_core.stager import Stager, iter_rows, read_metadata, relations_of, staged_files
from cdc_core.state import read_json, schema_history, write_json
from cdc_core.storage import Location, ObjectPath, S3Options, location, publish, write_atomic
from tests.unit.test_config import write_home
from tests.unit.test_stager import ORDERS, chunk

BUCKET = "lake"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Options]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = S3Options(f"http://{host}:{port}", "us-east-1", "testing", "testing", ssl=False)
    fs = pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1",
        access_key="testing", secret_key="testing", allow_bucket_creation=True,
    )  # fmt: skip
    fs.create_dir(BUCKET)
    try:
        yield options
    finally:
        server.stop()


@pytest.fixture
def lake(s3: S3Options, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lake]:
    """A lake on the object store; the test runs in an empty working directory, which must
    stay empty (the bug of old: `s3a:` folders written locally)."""
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield Lake(f"s3a://{BUCKET}/{request.node.name}", s3)
    finally:
        os.chdir(before)
    assert list(tmp_path.iterdir()) == [], "a lake on S3 wrote local files"


def test_spark_settings_name_the_store_and_the_root_becomes_an_object_path() -> None:
    conf = {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9",
        "spark.hadoop.fs.s3a.bucket.lake.endpoint": "http://127.0.0.1:10",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "very-secret",
    }
    lake = Lake.of("s3a://lake/p", conf)
    assert lake.options == S3Options("http://127.0.0.1:10", None, "AK", "very-secret", None, False)
    assert "very-secret" not in repr(lake)
    assert str(lake.changes) == "s3a://lake/p/_staging/changes"  # what Spark reads
    assert isinstance(lake.state, ObjectPath)
    assert lake.state.key == "lake/p/_state"
    assert Lake.of("/data/lake/p", conf).state == Path("/data/lake/p/_state")
    assert location("file:///data/x") == Path("/data/x")
    with pytest.raises(TerminalError, match="abfss:// file system is not supported"):
        location("abfss://c@a.dfs.core.windows.net/x")
    with pytest.raises(TypeError):
        os.fspath(lake.state)  # type: ignore[call-overload]  # no local path, ever


def test_objects_read_write_list_and_delete(lake: Lake) -> None:
    doc = lake.state / "a.json"
    assert read_json(doc) is None
    assert not doc.exists()
    write_json(doc, {"x": 1})
    write_atomic(lake.state / "b.json", b'{"x": 2}')
    assert read_json(doc) == {"x": 1}
    assert doc.is_file()
    assert lake.state.is_dir()
    assert sorted(p.name for p in lake.state.glob("*.json")) == ["a.json", "b.json"]
    assert doc.stat().st_size == len(doc.read_bytes())
    doc.unlink()
    doc.unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError):
        doc.unlink()
    with pytest.raises(FileNotFoundError):
        doc.read_text()
    assert [p.name for p in lake.state.iterdir()] == ["b.json"]
    assert list((lake.state / "nothing").iterdir()) == []


def test_a_small_object_is_one_put_and_a_write_cut_short_leaves_no_upload(
    lake: Lake, s3: S3Options
) -> None:
    """pyarrow begins a multipart upload when a stream opens, unless told to wait: every state
    document cost three requests, and a run killed while writing one left an upload behind."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3.endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    doc = lake.state / "cut.json"
    stream = doc.fs.open_output_stream(doc.key)  # as write_bytes opens it; killed before close
    try:
        stream.write(b'{"x": 1}')
        uploads = client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        assert not doc.exists()
    finally:
        stream.close()
    assert uploads == []
    assert read_json(doc) == {"x": 1}
    with pytest.raises(OSError, match="NO_SUCH_BUCKET"):  # still said, at close
        ObjectPath.parse("s3a://no-such-bucket/x.json", s3).write_bytes(b"{}")


def test_staged_files_publish_whole_and_a_new_stager_resumes_after_them(lake: Lake) -> None:
    stager = Stager(lake.changes, lake.staging_tmp)
    stager.recover()
    stager.add(chunk(1000, 1010, 3, relations=True))
    stager.add(chunk(2000, 2010, 2))
    published = stager.flush()
    assert published is not None
    assert staged_files(lake.changes) == [published]
    assert list(lake.staging_tmp.iterdir()) == []  # the temporary object went
    path = lake.changes / str(published)
    assert read_metadata(path)["changes"] == 5
    assert relations_of(path) == {(ORDERS.oid, 0): ORDERS}
    assert [r["commit_lsn"] for r in iter_rows(path)] == [1000] * 3 + [2000] * 2

    again = Stager(lake.changes, lake.staging_tmp)
    assert again.published_end == published.end


def test_a_half_written_file_is_never_published_and_recover_removes_it(lake: Lake) -> None:
    stager = Stager(lake.changes, lake.staging_tmp)
    stager.add(chunk(1000, 1010, 3, relations=True))
    stager._write_row_group()  # a row group sent: the temporary object is being written
    stager._written()  # the writer thread is done with it (closing it mid-write crashed Python)
    stager._writer.close()  # type: ignore[union-attr]  # as a killed run's upload may end
    assert staged_files(lake.changes) == []
    assert len(list(lake.staging_tmp.iterdir())) == 1
    Stager(lake.changes, lake.staging_tmp).recover()
    assert list(lake.staging_tmp.iterdir()) == []


def test_publish_on_the_store_copies_then_removes(lake: Lake) -> None:
    tmp, final = lake.staging_tmp / "x.parquet", lake.changes / "y.parquet"
    write_atomic(tmp, b"whole")
    publish(tmp, final)
    assert final.read_bytes() == b"whole"
    assert not tmp.exists()


def test_batch_lines_are_objects_and_a_missing_pointer_heals(lake: Lake) -> None:
    assert last_batch(lake) is None
    assert batch_lines_after(lake, 0) == []
    for n in (1, 2, 3):
        record_batch(lake, {"batch": n, "changes": n * 10})
    assert last_batch(lake) == {"batch": 3, "changes": 30}
    assert [r["batch"] for r in batch_lines_after(lake, 1)] == [2, 3]
    folder = batches_file(lake)
    assert isinstance(folder, ObjectPath)
    write_atomic(
        folder / f"{4:012d}.json", b'{"batch": 4, "changes": 40}'
    )  # died before the pointer
    assert last_batch(lake) == {"batch": 4, "changes": 40}
    assert [r["batch"] for r in batch_lines_after(lake, 2)] == [3, 4]


def test_old_batch_objects_the_metrics_table_holds_are_deleted(lake: Lake) -> None:
    from tests.unit.test_metrics import DAY, NOW, line

    for n, days in [(1, 20), (2, 19), (3, 18), (4, 10), (5, 1)]:
        record_batch(lake, line(n, days))
    folder = batches_file(lake)
    assert isinstance(folder, ObjectPath)
    (folder / f"{2:012d}.json").unlink()  # deleted by a pruning that died before its pointer

    assert prune_batch_lines(lake, 2, 7, now_s=NOW) == 1  # the table holds up to 2 only
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [3, 4, 5]
    assert prune_batch_lines(lake, 5, 15, now_s=NOW) == 1  # batch 3; 4 is younger
    assert prune_batch_lines(lake, 5, 7, now_s=NOW) == 1  # from the pointer on: batch 4
    assert prune_batch_lines(lake, 5, 1, now_s=NOW + 30 * DAY) == 0  # the newest stays
    assert [r["batch"] for r in batch_lines_after(lake, 0)] == [5]
    assert last_batch(lake) == line(5, 1)


def test_notification_objects_are_read_after_the_newest_one_held(lake: Lake) -> None:
    from cdc_core.notifications import (
        INITIAL_SNAPSHOT,
        Notification,
        NotificationType,
        Notifier,
        SinkPosition,
        sink_records_after,
    )

    notifier = Notifier(lake, "orders", sink_topic="n")
    for n, kind in enumerate((NotificationType.STARTED, NotificationType.COMPLETED), 1):
        notifier.send(Notification(f"j-{n}", INITIAL_SNAPSHOT, kind, {}, 1_795_000_000_000 + n))
    records, position = sink_records_after(lake, "n", SinkPosition())
    assert [r["id"] for r in records] == ["j-1", "j-2"]
    assert position.held == 2
    assert isinstance(position.after, str)
    assert position.after.startswith("1795000000002-")
    notifier.send(
        Notification("j-3", INITIAL_SNAPSHOT, NotificationType.STARTED, {}, 1_795_000_000_003)
    )
    records, after = sink_records_after(lake, "n", position)
    assert [r["id"] for r in records] == ["j-3"]
    assert after.held == 3
    assert sink_records_after(lake, "n", after) == ([], after)
    assert [r["id"] for r in sink_records_after(lake, "n", SinkPosition(1))[0]] == ["j-2", "j-3"]


def test_schema_history_lists_entries_on_the_store(lake: Lake) -> None:
    from cdc_core.bronze import record_schema

    record_schema(lake, ORDERS, 100)
    record_schema(lake, ORDERS, 200)  # the same shape: nothing new
    assert schema_history(lake, "public.orders") == [(100, ORDERS)]


def test_the_run_lock_is_local_and_its_holder_is_on_the_store(
    lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = tmp_path.parent / f"{tmp_path.name}-locks"
    monkeypatch.setenv("CDC_LOCK_DIR", str(locks))
    assert lock_file(lake).parent == locks
    with run_lock(lake, "p") as me:
        assert isinstance(holder_file(lake), ObjectPath)
        assert read_holder(lake) == me
        with pytest.raises(RunLockedError, match="already running"), run_lock(lake, "p"):
            pass
    assert read_holder(lake) is None
    assert not holder_file(lake).exists()


def test_maintenance_on_the_store_is_refused_while_ingest_holds_the_run_lock(
    lake: Lake, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Delta's S3 log store is safe for one writing process: maintenance on an object store
    takes the pipeline's run lock, and while an ingest holds it, it is refused (exit 75)
    before it starts Spark."""
    from cdc_core import maintenance

    monkeypatch.setenv("CDC_LOCK_DIR", str(tmp_path.parent / f"{tmp_path.name}-locks"))
    home = write_home(tmp_path_factory.mktemp("home"))
    config = load_pipeline("orders", "local", home=home, environ={})
    monkeypatch.setattr(maintenance, "Lake", SimpleNamespace(of=lambda root, conf: lake))

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("maintenance started Spark while ingest held the run lock")

    monkeypatch.setattr(maintenance, "build_spark", no_spark)
    with run_lock(lake, "orders"):
        with pytest.raises(RunLockedError, match="already running") as refused:
            maintenance.maintain(config)
        assert refused.value.exit_code == 75


def test_status_reads_delta_logs_and_batches_on_the_store(lake: Lake) -> None:
    from cdc_core.bronze import WATERMARK
    from cdc_core.status import table_status
    from tests.unit.test_status import add, commit

    bronze = lake.place(lake.bronze)
    assert table_status("bronze", bronze, WATERMARK).state == "not_created"
    commit(bronze, 0, {"add": add("a.parquet", 9)}, metadata={WATERMARK: "0/10"})  # type: ignore[arg-type]
    commit(bronze, 1, {"add": add("b.parquet", 3, dv=1)}, metadata={"other": 1})  # type: ignore[arg-type]
    status = table_status("bronze", bronze, WATERMARK)
    assert (status.state, status.rows, status.version, status.staged_end) == (
        "created", 11, 1, "0/10",
    )  # fmt: skip


def test_the_metrics_table_age_is_read_from_its_log_on_the_store(lake: Lake) -> None:
    from cdc_core.metrics import metrics_table, metrics_table_age
    from tests.unit.test_status import commit

    assert metrics_table_age(lake) is None  # no table: an append is due
    commit(lake.place(metrics_table(lake)), 0, metadata={"x": 1})  # type: ignore[arg-type]
    age = metrics_table_age(lake)
    assert age is not None
    assert -5 < age < 60  # written just now (the store's clock is this machine's)


def test_status_of_a_lake_on_a_missing_bucket_or_a_store_down_says_so(
    s3: S3Options, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing bucket lists as an empty lake (status said ok, nothing created yet, beside a
    slot confirmed far ahead); a store that does not answer was an `unexpected OSError` that
    showed nothing, the source's part included."""
    from cdc_core import status as st

    config = load_pipeline("orders", "local", home=write_home(tmp_path_factory.mktemp("h")),
                           environ={})  # fmt: skip
    slot = st.SlotStatus("orders_cdc", True, False, None, "reserved", "0/16B3748", "0/16B3710")
    monkeypatch.setattr(st, "read_slot", lambda dsn, name: (st.SourceStatus(True), slot))
    down = S3Options("http://127.0.0.1:9", "us-east-1", "testing", "testing", ssl=False)
    lakes = {"missing": Lake("s3a://no-such-bucket/p", s3), "down": Lake("s3a://lake/p", down),
             "there": Lake(f"s3a://{BUCKET}/p", s3)}  # fmt: skip
    found = {}
    for name, lake in lakes.items():
        monkeypatch.setattr(st, "Lake", SimpleNamespace(of=lambda root, conf, lake=lake: lake))
        found[name] = st.gather_status(config)

    assert found["missing"].problems == (
        "bronze: bucket no-such-bucket of s3a://no-such-bucket/p does not exist, or these "
        "credentials cannot see it",
    )
    assert found["missing"].slot == slot  # the source's part still shown
    assert found["missing"].exit_code == 1
    [problem] = found["down"].problems
    assert problem.startswith("bronze: the object store holding s3a://lake/p cannot be read: ")
    assert "NETWORK_CONNECTION" in problem
    assert found["there"].problems == ()  # an empty lake on a bucket that exists is no problem
    assert found["there"].exit_code == 0


def test_a_job_on_a_missing_bucket_stops_naming_it_before_it_writes(
    s3: S3Options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingest's first write (the run lock's holder) failed with `unexpected OSError: When
    initiating multiple part upload ... NO_SUCH_BUCKET`, exit 1; validate and the commands that
    only read found an empty lake."""
    from cdc_core.state import check_owner

    monkeypatch.setenv("CDC_LOCK_DIR", str(tmp_path / "locks"))
    lake = Lake("s3a://no-such-bucket/p", s3)
    said = "bucket no-such-bucket of s3a://no-such-bucket/p does not exist, or these credentials"
    with pytest.raises(TerminalError, match=said) as stopped, run_lock(lake, "orders"):
        pass
    assert stopped.value.exit_code == 1
    with pytest.raises(TerminalError, match=said):
        check_owner(lake, "orders")
    down = Lake("s3a://lake/p", S3Options("http://127.0.0.1:9", "us-east-1", "t", "t", ssl=False))
    with pytest.raises(TransientError, match="cannot be read: When") as waits:
        check_owner(down, "orders")
    assert waits.value.exit_code == 75


def test_a_job_asks_the_store_once_whether_its_bucket_is_there(
    s3: S3Options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run lock and the owner check each asked (a HEAD of the bucket twice per job)."""
    from cdc_core import lake as lake_module
    from cdc_core.state import check_owner

    asked: list[Location] = []

    def store_problem(root: Location) -> None:
        asked.append(root)

    monkeypatch.setattr(lake_module, "store_problem", store_problem)
    monkeypatch.setenv("CDC_LOCK_DIR", str(tmp_path / "locks"))
    lake = Lake(f"s3a://{BUCKET}/once", s3)
    with run_lock(lake, "orders"):
        check_owner(lake, "orders", claim=True)
    assert read_json(lake.state / "pipeline.json") == {"pipeline": "orders"}
    assert asked == [lake.home]
