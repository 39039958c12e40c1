"""Stage 2: committed transactions -> durable Parquet change files named by LSN range.

A file holds whole transactions: it is written under `_staging/tmp/`, fsynced, then renamed to
`_staging/changes/<first commit LSN>_<last end LSN>.parquet`, so no reader sees half a file and
names sort in LSN order. Each change is the pgoutput message as the server sent it (lossless; its
tuples are decoded after staging), and the footer's `cdc` metadata holds the Relation
descriptors needed to read them without the server.
A large transaction is written in row groups as it arrives, so it never sits in memory.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_core import faults
from cdc_core.errors import TerminalError, first_line, text_of
from cdc_core.events import ChangeChunk, ChangeOp, RelationDescriptor
from cdc_core.lsn import Lsn
from cdc_core.storage import Location, arrow, publish

FORMAT_VERSION = 1
METADATA_KEY = b"cdc"

SCHEMA = pa.schema(
    [
        ("commit_lsn", pa.int64()),  # the transaction's commit LSN: files and rows sort by it
        ("xid", pa.int64()),
        ("commit_time_us", pa.int64()),
        ("lsn", pa.int64()),  # of the change itself
        ("seq", pa.int32()),  # position in the transaction
        ("op", pa.string()),  # c u d t m, from the message's first byte
        ("relation_oid", pa.int64()),  # null for logical messages
        ("relation_version", pa.int32()),  # which descriptor in the footer reads this row
        ("message", pa.binary()),  # the pgoutput message exactly as the server sent it
    ]
)
# every column but the messages: their values are all different (a dictionary is hashed, then
# given up, and compresses worse) and no reader filters on them
_SMALL_VALUES = [name for name in SCHEMA.names if name != "message"]
_PG_KINDS = pa.array(["I", "U", "D", "T", "M"], pa.large_string())
_OPS = pa.array([op.value for op in (ChangeOp.CREATE, ChangeOp.UPDATE, ChangeOp.DELETE,
                                     ChangeOp.TRUNCATE, ChangeOp.MESSAGE)])  # fmt: skip


@dataclass(frozen=True, order=True)
class StagedFile:
    """A staged change file: whole transactions from commit LSN `start` to end LSN `end`."""

    start: Lsn
    end: Lsn

    SUFFIX = ".parquet"

    @classmethod
    def parse(cls, name: str) -> StagedFile:
        stem = name.removesuffix(cls.SUFFIX)
        start, sep, end = stem.partition("_")
        if not sep or not name.endswith(cls.SUFFIX):
            raise ValueError(f"{name!r} is not a staged change file name")
        return cls(Lsn.parse(start), Lsn.parse(end))

    @property
    def id(self) -> str:
        """Stable identity of the file, used by the stages after staging."""
        return f"{self.start.hex16}_{self.end.hex16}"

    def __str__(self) -> str:
        return self.id + self.SUFFIX


@dataclass(frozen=True)
class XidFloor:
    """What a capture saw before reading the slot: the WAL flush position `lsn`, then a
    transaction id `xid` (32-bit) given out after it. A transaction with an id from `xid` on got
    it after `lsn` was written, so it commits after `lsn`: no file ending at or before `lsn`
    holds it."""

    lsn: Lsn
    xid: int

    KEY = "xid_floor"

    def to_json(self) -> dict[str, object]:
        return {"lsn": str(self.lsn), "xid": self.xid}

    @classmethod
    def of(cls, metadata: Mapping[str, object]) -> XidFloor | None:
        """A staged file's floor; None for a file staged before floors were recorded."""
        raw = metadata.get(cls.KEY)
        if not isinstance(raw, dict):
            return None
        return cls(Lsn.parse(str(raw["lsn"])), int(raw["xid"]) % (1 << 32))


def staged_files(folder: Location) -> list[StagedFile]:
    """Every published file, in LSN order."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        try:
            found.append(StagedFile.parse(path.name))
        except ValueError:
            continue  # not ours
    return sorted(found)


@contextlib.contextmanager
def reading_staged(path: Location) -> Iterator[None]:
    """Around a read of a published staged file: one damaged since (cut short by a copy or a
    restore, overwritten) stops the run with `damaged_staged`, not an unexpected error. A file
    gone is the caller's to handle (maintenance removes those bronze holds). On a local disk
    any other read error but a refusal is damage too (a page that does not decompress, EIO);
    on an object store it may pass, and is left to the store's own handling."""
    try:
        yield
    except FileNotFoundError:
        raise
    except pa.ArrowInvalid as e:  # what pyarrow says of a footer or metadata it cannot parse
        raise damaged_staged(path, e) from e
    except OSError as e:
        if isinstance(path, Path) and not isinstance(e, PermissionError):
            raise damaged_staged(path, e) from e
        raise


# A Spark read of staged files that failed on one, and why, when the why is its content: pages
# that no longer decode, though the footer `reading_staged` checked is whole. A read error the
# store gave (a connection reset) is no damage, and is left as it is.
_SPARK_READ_FAILED = re.compile(
    r"\[FAILED_READ_FILE\.\w+\] Encountered error while reading file "
    r"\S*?/([0-9A-F]{16}_[0-9A-F]{16}\.parquet)"
)
_UNDECODABLE = re.compile(
    r"^Caused by: (\S*(?:ParquetDecodingException|ZstdIOException|ZstdException|SnappyException|"
    r"DataFormatException|ZipException)\S*: .*)$",
    re.MULTILINE,
)


def damaged_in_spark(error: BaseException, changes: Location) -> TerminalError | None:
    """`damaged_staged` for the staged file under `changes` a failed Spark read names, when
    what failed was decoding its pages; None for any other error."""
    text = text_of(error) or ""
    read, causes = _SPARK_READ_FAILED.search(text), _UNDECODABLE.findall(text)
    if read is None or not causes:
        return None
    return damaged_staged(changes / read.group(1), causes[-1])


def damaged_staged(path: Location, error: BaseException | str) -> TerminalError:
    reason = re.sub(r"^Could not open Parquet input source '[^']*': ", "", first_line(error))
    return TerminalError(
        f"staged change file {path} cannot be read ({reason}): it was damaged after "
        "it was staged, and the slot will not send its changes again. Restore it from a backup "
        "of the lake; failing that, move it out of _staging/changes, run again, and take an "
        "incremental snapshot of each captured table (`cdc snapshot --pipeline NAME --table T`) "
        "to bring the mirrors back in line with the source"
    )


def read_metadata(path: Location) -> dict[str, object]:
    """The `cdc` footer metadata of a staged file."""
    where, fs = arrow(path)
    with reading_staged(path):
        meta = pq.read_metadata(where, filesystem=fs).metadata or {}
        if METADATA_KEY not in meta:
            raise TerminalError(f"{path} has no cdc metadata: it is not a staged change file")
        try:
            data: dict[str, object] = json.loads(meta[METADATA_KEY])
        except ValueError as e:
            raise damaged_staged(path, e) from e
    return data


def relations_of(path: Location) -> dict[tuple[int, int], RelationDescriptor]:
    """The Relation descriptors of a staged file, by (oid, version)."""
    raw = read_metadata(path)["relations"]
    assert isinstance(raw, list)
    out = [RelationDescriptor.from_json(r) for r in raw]
    return {(r.oid, r.version): r for r in out}


@dataclass(frozen=True)
class LargestChange:
    """The largest change among some staged files, as the server sent it."""

    size: int  # bytes of its pgoutput message
    lsn: Lsn
    table: str  # schema.table, or "a logical message"


def largest_change(folder: Location, files: Sequence[StagedFile]) -> LargestChange | None:
    """The largest change in `files` (reads their messages: for error messages, not a hot path)."""
    found: LargestChange | None = None
    for f in files:
        path = folder / str(f)
        where, fs = arrow(path)
        columns = ["lsn", "relation_oid", "relation_version", "message"]
        with reading_staged(path):
            table = pq.read_table(where, columns=columns, filesystem=fs)
        if not table.num_rows:
            continue
        sizes = pc.binary_length(table["message"])
        i = int(pc.index(sizes, pc.max(sizes)).as_py())
        size = int(sizes[i].as_py())
        if found is not None and size <= found.size:
            continue
        oid, version = table["relation_oid"][i].as_py(), table["relation_version"][i].as_py()
        relation = relations_of(path).get((oid, version)) if oid is not None else None
        name = f"{relation.schema}.{relation.table}" if relation else "a logical message"
        found = LargestChange(size, Lsn(int(table["lsn"][i].as_py())), name)
    return found


@dataclass(frozen=True)
class Limits:
    """When a row group is written and when a file is published (at a transaction boundary)."""

    row_group_changes: int = 100_000
    row_group_bytes: int = 64 << 20
    file_changes: int = 1_000_000
    file_bytes: int = 256 << 20


class Stager:
    """Appends chunks to the open file and publishes it atomically at transaction boundaries."""

    def __init__(
        self,
        folder: Location,
        tmp: Location,
        *,
        limits: Limits = Limits(),
        compression: str = "zstd",
        source: Mapping[str, str] | None = None,
        floor: XidFloor | None = None,
    ) -> None:
        self.folder, self.tmp = folder, tmp
        self.source = dict(source or {})  # database, pipeline, slot: recorded in each footer
        self.floor = floor  # recorded in each footer: where a snapshot read's search ends
        self.limits = limits
        self.compression = compression
        self.relations: dict[tuple[int, int], RelationDescriptor] = {}
        existing = staged_files(folder)
        self.published_end = existing[-1].end if existing else Lsn(0)
        self.last_end = self.published_end  # end of the last whole transaction taken
        self.clean_end = self.published_end  # nothing unpublished before this
        self.published: list[StagedFile] = []
        self._reset_file()

    def _reset_file(self) -> None:
        self._parts: list[pa.RecordBatch] = []  # buffered changes, written as one row group
        self._buffered = self._buffered_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._writing: Future[None] | None = None  # the row group being written, if any
        self._path: Location | None = None
        self._file_start: int | None = None
        self._file_rows = self._file_bytes = self._transactions = 0
        self._file_relations: set[tuple[int, int]] = set()
        self._in_transaction = False

    def recover(self) -> None:
        """Remove files a killed run left half written; nothing ever read them."""
        if self.tmp.is_dir():
            for leftover in self.tmp.iterdir():
                leftover.unlink()

    @property
    def pending(self) -> bool:
        """Whether changes are held that are not yet in a published file."""
        return self._file_rows > 0 or self._in_transaction

    def durable_end(self) -> Lsn:
        """How far the slot may be confirmed: nothing before this is unstaged."""
        return self.clean_end if self.pending else self.last_end

    def add(self, chunk: ChangeChunk) -> StagedFile | None:
        """Take a chunk; returns the file published when this chunk completed one."""
        for r in chunk.relations:
            self.relations[(r.oid, r.version)] = r
        if len(chunk):
            self._append(chunk)
        self._in_transaction = not chunk.last
        if not chunk.last:
            return None
        self.last_end = Lsn(chunk.end_lsn)
        if not self._file_rows:  # a transaction without captured changes: nothing to stage
            self.clean_end = self.last_end
        if len(chunk) or chunk.first_seq:
            self._transactions += 1
        full = (
            self._file_rows >= self.limits.file_changes
            or self._file_bytes >= self.limits.file_bytes
        )
        return self.flush() if full else None

    def _append(self, chunk: ChangeChunk) -> None:
        n = len(chunk)
        if self._file_start is None:
            self._file_start = chunk.commit_lsn
        lsn, oid, message = chunk.columns()
        versions = chunk.versions
        used = [o for o in pc.unique(oid).to_pylist() if o is not None]
        missing = [o for o in used if o not in versions]
        if missing:
            raise TerminalError(f"changes of relation OIDs {missing} without a Relation descriptor")
        known = pa.array(list(versions), pa.int64())
        version = pa.array(list(versions.values()), pa.int32()).take(pc.index_in(oid, known))
        self._file_relations.update((o, versions[o]) for o in used)
        first = pc.cast(pc.binary_slice(message, 0, 1), pa.large_string())
        columns = {
            "commit_lsn": pa.array(np.full(n, chunk.commit_lsn, np.int64)),
            "xid": pa.array(np.full(n, chunk.xid, np.int64)),
            "commit_time_us": pa.array(np.full(n, chunk.commit_time_us, np.int64)),
            "lsn": lsn,
            "seq": pa.array(np.arange(chunk.first_seq, chunk.first_seq + n, dtype=np.int32)),
            "op": _OPS.take(pc.index_in(first, value_set=_PG_KINDS)),
            "relation_oid": oid,
            "relation_version": version,
            "message": message.cast(pa.binary()),
        }
        part = pa.RecordBatch.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)
        self._parts.append(part)
        self._buffered += n
        self._buffered_bytes += chunk.nbytes
        self._file_rows += n
        self._file_bytes += chunk.nbytes
        if (self._buffered >= self.limits.row_group_changes
                or self._buffered_bytes >= self.limits.row_group_bytes):  # fmt: skip
            self._write_row_group()

    def _write_row_group(self) -> None:
        """Write the buffered changes as one row group, on the writer thread: compressing them
        releases Python's lock, so the reader goes on fetching meanwhile. One row group is in
        flight at a time, and a file is closed and published only once its writes are done."""
        if not self._buffered:
            return
        self._written()
        if self._writer is None:
            self.tmp.mkdir(parents=True, exist_ok=True)
            self._path = self.tmp / f"{uuid.uuid4().hex}.parquet"
            where, fs = arrow(self._path)
            self._writer = pq.ParquetWriter(
                where, SCHEMA, compression=self.compression, filesystem=fs,
                use_dictionary=_SMALL_VALUES, write_statistics=_SMALL_VALUES,
            )  # fmt: skip
        table = pa.Table.from_batches(self._parts, schema=SCHEMA)
        self._writing = _writer_thread().submit(
            self._writer.write_table, table, row_group_size=max(table.num_rows, 1)
        )  # one row group
        self._parts = []
        self._buffered = self._buffered_bytes = 0

    def _written(self) -> None:
        """Wait for the row group in flight; a write that failed raises here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def flush(self) -> StagedFile | None:
        """Publish the open file (it ends at a transaction boundary); None when it is empty."""
        if self._in_transaction:
            raise RuntimeError("flush inside a transaction: files hold whole transactions only")
        if not self._file_rows:
            return None
        self._write_row_group()
        self._written()
        assert self._writer is not None
        assert self._path is not None
        assert self._file_start is not None
        staged = StagedFile(Lsn(self._file_start), self.last_end)
        self._writer.add_key_value_metadata({METADATA_KEY: json.dumps(self._metadata(staged))})
        self._writer.close()
        faults.point("stager.before_publish")
        publish(self._path, self.folder / str(staged))  # fsynced, then renamed (or copied)
        faults.point("stager.after_publish")
        self.published_end = self.clean_end = staged.end
        self.published.append(staged)
        self._reset_file()
        return staged

    def _metadata(self, staged: StagedFile) -> dict[str, object]:
        data = {
            "format": FORMAT_VERSION,
            "start_lsn": str(staged.start),
            "end_lsn": str(staged.end),
            "transactions": self._transactions,
            "changes": self._file_rows,
            "staged_at_us": time.time_ns() // 1000,
            "source": self.source,
            "relations": [self.relations[k].to_json() for k in self._referenced()],
        }
        if self.floor is not None:
            data[XidFloor.KEY] = self.floor.to_json()
        return data

    def _referenced(self) -> list[tuple[int, int]]:
        """(oid, version) of every relation the open file's rows use (messages use none)."""
        return sorted(self._file_relations)

    def abort(self) -> None:
        """Drop the open file (the transactions in it will be read again). Safe in any state:
        nothing open, a write or the footer failed, the file closed but not published."""
        writing = self._writing
        if writing is not None:
            writing.exception()  # waits; the file is dropped whatever the write did
        if self._writer is not None:
            with contextlib.suppress(OSError):  # a full disk fails the footer too: dropped anyway
                self._writer.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self.last_end = self.clean_end
        self._reset_file()


@functools.cache
def _writer_thread() -> ThreadPoolExecutor:
    """The one thread that writes staged row groups (stagers take turns on it)."""
    return ThreadPoolExecutor(1, thread_name_prefix="cdc-stager")


def iter_rows(path: Location) -> Iterator[dict[str, object]]:
    """Every staged change of a file as a dict (tests and tools; not a hot path)."""
    where, fs = arrow(path)
    for batch in pq.ParquetFile(where, filesystem=fs).iter_batches():
        yield from batch.to_pylist()
