"""The stager publishes whole transactions atomically, in files named by LSN range."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_core.errors import TerminalError
from cdc_core.events import ChangeChunk, ColumnDescriptor, RelationDescriptor
from cdc_core.lsn import Lsn
from cdc_core.metrics import staged_facts
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.stager import (
    LargestChange,
    Limits,
    StagedFile,
    Stager,
    damaged_in_spark,
    iter_rows,
    largest_change,
    read_metadata,
    relations_of,
    staged_files,
)

ORDERS = RelationDescriptor(
    16400, 0, "public", "orders", ReplicaIdentity.DEFAULT,
    (ColumnDescriptor("id", 20, -1, "bigint", True), ColumnDescriptor("note", 25, -1, "text", False)),
    ("id",),
)  # fmt: skip


def insert(i: int) -> bytes:
    """An INSERT message of `orders` carrying the one-column tuple `row<i>`."""
    value = f"row{i}".encode()
    return (
        b"I"
        + struct.pack(">I", ORDERS.oid)
        + b"N"
        + struct.pack(">hci", 1, b"t", len(value))
        + value
    )


def chunk(
    commit: int, end: int, n: int, *, first_seq: int = 0, last: bool = True, relations: bool = False
) -> ChangeChunk:
    c = ChangeChunk(
        xid=commit, commit_lsn=commit, commit_time_us=1_700_000_000_000_000, first_seq=first_seq
    )
    for i in range(n):
        c.add(commit - 100 + first_seq + i, ORDERS.oid, insert(first_seq + i))
    c.versions = {ORDERS.oid: 0}
    c.last, c.end_lsn = last, end if last else 0
    if relations:
        c.relations.append(ORDERS)
    return c


def stager(tmp_path: Path, **limits: int) -> Stager:
    return Stager(tmp_path / "changes", tmp_path / "tmp", limits=Limits(**limits))


def test_names_parse_back_and_sort_in_lsn_order() -> None:
    a = StagedFile(Lsn.parse("0/FFFFFFFF"), Lsn.parse("1/10"))
    b = StagedFile(Lsn.parse("1/20"), Lsn.parse("A/0"))
    assert str(a) == "00000000FFFFFFFF_0000000100000010.parquet"
    assert StagedFile.parse(str(a)) == a
    assert sorted([str(b), str(a)]) == [str(a), str(b)]
    with pytest.raises(ValueError, match="not a staged change file"):
        StagedFile.parse("0000000000000001.parquet")


def test_a_file_holds_whole_transactions_named_by_their_range(tmp_path: Path) -> None:
    s = stager(tmp_path)
    assert s.add(chunk(1000, 1010, 2, relations=True)) is None
    assert s.add(chunk(2000, 2010, 3)) is None
    staged = s.flush()
    assert staged == StagedFile(Lsn(1000), Lsn(2010))
    path = tmp_path / "changes" / str(staged)
    rows = list(iter_rows(path))
    assert [(r["commit_lsn"], r["seq"], r["op"], r["message"]) for r in rows] == [
        (1000, 0, "c", insert(0)), (1000, 1, "c", insert(1)),
        (2000, 0, "c", insert(0)), (2000, 1, "c", insert(1)), (2000, 2, "c", insert(2)),
    ]  # fmt: skip
    assert {(r["relation_oid"], r["relation_version"]) for r in rows} == {(ORDERS.oid, 0)}
    meta = read_metadata(path)
    assert (meta["changes"], meta["transactions"], meta["end_lsn"]) == (5, 2, str(Lsn(2010)))
    assert relations_of(path) == {(ORDERS.oid, 0): ORDERS}
    assert s.published_end == Lsn(2010)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_large_transaction_spills_in_row_groups_and_publishes_at_commit(tmp_path: Path) -> None:
    s = stager(tmp_path, row_group_changes=4)
    s.add(chunk(1000, 0, 5, last=False, relations=True))
    assert s.pending
    assert staged_files(tmp_path / "changes") == []
    assert len(list((tmp_path / "tmp").iterdir())) == 1  # already on disk, not yet visible
    s.add(chunk(1000, 1500, 5, first_seq=5))
    staged = s.flush()
    assert staged is not None
    path = tmp_path / "changes" / str(staged)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2  # one per full buffer
    assert [r["seq"] for r in iter_rows(path)] == list(range(10))


def test_files_roll_over_at_a_transaction_boundary(tmp_path: Path) -> None:
    s = stager(tmp_path, file_changes=4)
    s.add(chunk(1000, 1010, 3, relations=True))
    first = s.add(chunk(2000, 2010, 3))
    assert first == StagedFile(Lsn(1000), Lsn(2010))
    s.add(chunk(3000, 3010, 1))
    assert s.flush() == StagedFile(Lsn(3000), Lsn(3010))
    assert staged_files(tmp_path / "changes") == [first, StagedFile(Lsn(3000), Lsn(3010))]
    assert relations_of(tmp_path / "changes" / str(StagedFile(Lsn(3000), Lsn(3010)))) == {
        (ORDERS.oid, 0): ORDERS
    }


def test_flush_refuses_to_cut_a_transaction(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.add(chunk(1000, 0, 2, last=False, relations=True))
    with pytest.raises(RuntimeError, match="whole transactions only"):
        s.flush()


def test_durable_end_moves_past_empty_transactions_only_when_nothing_is_pending(
    tmp_path: Path,
) -> None:
    s = stager(tmp_path)
    s.add(chunk(1000, 1010, 0))
    assert s.durable_end() == Lsn(1010)
    s.add(chunk(2000, 2010, 2, relations=True))
    s.add(chunk(3000, 3010, 0))
    assert s.durable_end() == Lsn(1010)  # rows of 2000 are not published yet
    s.flush()
    assert s.durable_end() == Lsn(3010)


def test_abort_drops_the_open_file_and_recover_clears_leftovers(tmp_path: Path) -> None:
    s = stager(tmp_path, row_group_changes=1)
    s.add(chunk(1000, 0, 3, last=False, relations=True))
    s.abort()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not s.pending
    (tmp_path / "tmp" / "half.parquet").write_bytes(b"PAR1")
    stager(tmp_path).recover()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_row_group_that_fails_to_write_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    s = stager(tmp_path, row_group_changes=2)
    assert s.add(chunk(1000, 1010, 2, relations=True)) is None  # written on the writer thread
    with pytest.raises(OSError, match="No space left"):
        s.flush()  # the failed write surfaces before anything is published
    assert staged_files(tmp_path / "changes") == []
    assert s.durable_end() == Lsn(0)
    s.abort()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_abort_drops_the_file_when_its_footer_fails_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stager(tmp_path, row_group_changes=1)
    s.add(chunk(1000, 0, 3, last=False, relations=True))
    assert list((tmp_path / "tmp").iterdir()), "a row group is written"

    real_close, failures = pq.ParquetWriter.close, [OSError(28, "No space left on device")]

    def disk_full_once(writer: pq.ParquetWriter) -> None:
        if failures:  # once: the writer's __del__ closes it again
            raise failures.pop()
        real_close(writer)

    monkeypatch.setattr(pq.ParquetWriter, "close", disk_full_once)
    s.abort()
    assert not failures, "the footer's write failed"
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not s.pending


def test_a_new_stager_resumes_after_the_last_published_file(tmp_path: Path) -> None:
    s = stager(tmp_path)
    s.add(chunk(1000, 1010, 1, relations=True))
    s.flush()
    again = stager(tmp_path)
    assert again.published_end == Lsn(1010)
    assert again.durable_end() == Lsn(1010)


def test_ops_follow_the_message_type_and_messages_have_no_relation(tmp_path: Path) -> None:
    c = chunk(1000, 1010, 1, relations=True)
    for kind in (b"U", b"D", b"T", b"M"):
        c.add(1000, None if kind == b"M" else ORDERS.oid, kind + b"...")
    s = stager(tmp_path)
    s.add(c)
    staged = s.flush()
    assert staged is not None
    rows = list(iter_rows(tmp_path / "changes" / str(staged)))
    assert [(r["op"], r["relation_version"]) for r in rows] == [
        ("c", 0),
        ("u", 0),
        ("d", 0),
        ("t", 0),
        ("m", None),
    ]


def test_the_largest_change_of_some_files_is_named_by_size_table_and_lsn(tmp_path: Path) -> None:
    s = stager(tmp_path)
    small = chunk(1000, 1010, 3, relations=True)
    s.add(small)
    first = s.flush()
    big = chunk(2000, 2010, 1)
    big.add(1950, ORDERS.oid, insert(1) + b"x" * 5000)  # the second change of the second file
    logical = chunk(3000, 3010, 0)
    logical.add(2990, None, b"M" + b"y" * 9000)
    s.add(big)
    second = s.flush()
    s.add(logical)
    third = s.flush()
    assert first is not None
    assert second is not None
    assert third is not None
    folder = tmp_path / "changes"
    found = largest_change(folder, [first, second])
    assert found == LargestChange(len(big.message[1]), Lsn(1950), "public.orders")
    assert largest_change(folder, [first, second, third]) == LargestChange(
        9001, Lsn(2990), "a logical message"
    )
    assert largest_change(folder, []) is None


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda data: data[: len(data) // 2], "Parquet magic bytes not found in footer"),
        (lambda data: b"", "Parquet file size is 0 bytes"),
    ],
    ids=["cut-in-half", "emptied"],
)
def test_a_staged_file_damaged_after_it_was_published_is_named_with_the_way_out(
    tmp_path: Path, damage: Callable[[bytes], bytes], said: str
) -> None:
    """A published file cut short (a copy or a restore that stopped) is read by a batch's
    freshness first and by bronze next: both stop naming it, what pyarrow said, and the way
    out, instead of an unexpected error. The slot is past its changes: nothing sends them again."""
    s = stager(tmp_path)
    s.add(chunk(1000, 1010, 2, relations=True))
    path = tmp_path / "changes" / str(s.flush())
    path.write_bytes(damage(path.read_bytes()))
    for read in (read_metadata, lambda p: staged_facts([p]), lambda p: largest_change(
        p.parent, [StagedFile.parse(p.name)])):  # fmt: skip
        with pytest.raises(TerminalError) as failed:
            read(path)
        message = str(failed.value)
        assert message.startswith(f"staged change file {path} cannot be read ({said}")
        assert message.endswith(
            "): it was damaged after it was staged, and the slot will not send its changes "
            "again. Restore it from a backup of the lake; failing that, move it out of "
            "_staging/changes, run again, and take an incremental snapshot of each captured "
            "table (`cdc snapshot --pipeline NAME --table T`) to bring the mirrors back in line "
            "with the source"
        )
        assert message.count(str(path)) == 1  # not again in what pyarrow said


def test_a_staged_file_whose_cdc_metadata_is_not_json_is_damaged(tmp_path: Path) -> None:
    path = tmp_path / "0000000000000001_0000000000000002.parquet"
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({b"cdc": b'{"changes": 1'}), path)
    with pytest.raises(TerminalError, match=r"^staged change file .* cannot be read \(.*\): it"):
        read_metadata(path)


def test_a_staged_file_with_a_page_overwritten_is_damaged_when_its_rows_are_read(
    tmp_path: Path,
) -> None:
    """The footer intact, a page overwritten: pyarrow raises OSError on the rows, which on a
    local disk is damage too (the first read of a batch, its freshness, stops naming it)."""
    s = stager(tmp_path)
    s.add(chunk(1000, 1010, 2, relations=True))
    path = tmp_path / "changes" / str(s.flush())
    data = path.read_bytes()
    path.write_bytes(data[:4] + b"\xff" * 50 + data[54:])
    assert read_metadata(path)["changes"] == 2
    with pytest.raises(TerminalError, match=r"^staged change file .* cannot be read \(.*\): it"):
        staged_facts([path])


# What a bronze job's save raised on a staged file whose `message` pages no longer decompress
# (its footer intact): a Py4J error's text, Java frames left out as `text_of` leaves them.
SPARK_READ_FAILED = """An error occurred while calling o1010.save.
: org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while reading \
file file:///lake/_staging/changes/000000000193A050_000000000193A080.parquet.  SQLSTATE: KD001
\tSuppressed: org.apache.spark.util.Utils$OriginalTryStackTraceException: Full stacktrace
Caused by: org.apache.parquet.io.ParquetDecodingException: could not decompress page
Caused by: com.github.luben.zstd.ZstdIOException: Data corruption detected
"""


def test_a_spark_read_that_could_not_decode_a_staged_file_s_pages_names_it_as_damaged() -> None:
    changes = Path("/lake/_staging/changes")

    damaged = damaged_in_spark(Exception(SPARK_READ_FAILED), changes)

    assert damaged is not None
    assert str(damaged).startswith(
        f"staged change file {changes / '000000000193A050_000000000193A080.parquet'} cannot be "
        "read (com.github.luben.zstd.ZstdIOException: Data corruption detected): it was "
        "damaged after it was staged"
    )
    store = SPARK_READ_FAILED.partition("Caused by:")[0] + "Caused by: java.net.SocketException: "
    assert damaged_in_spark(Exception(store + "Connection reset"), changes) is None  # no damage
    other = "Caused by: org.apache.parquet.io.ParquetDecodingException: could not decompress"
    assert damaged_in_spark(Exception(other), changes) is None  # no staged file named
