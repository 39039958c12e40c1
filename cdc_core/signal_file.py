"""Signals: Debezium's file channel (`signal.file`), taken at the start of a run, like the table's.

A line of the file is one signal, a JSON object as Debezium's FileSignalChannel reads it:
`{"id": "s-1", "type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}`.
`data` is an object, whose JSON is passed on as the signal table's `data` column holds it (a
string holding that JSON is taken too). The types and what they do are the signal table's
(`cdc_core.signals`). Blank lines are skipped; a line that is not a JSON object with an `id`
and a `type` is a `SignalProblem` naming the file and the line, logged once, never retried. A
missing file holds no signals.

Debezium reads the whole file, empties it, then carries the signals out: a crash in between
loses them, and so are lines appended between its read and its truncation. Here the lines go
through the lake's state (`_state/signal_file.json`, the `Batch`) before they leave the file:

1. `_take`: read the file; record the bytes taken (whole lines; a last line without its newline
   only if it is complete JSON, else it may be half written), their length and SHA-256, and the
   lines, under a new batch id; written in one step, durably.
2. `_strip`: if the file still starts with those bytes, the rest replaces it in one step (a new
   file renamed over it), and what a writer appended to the old file meanwhile is copied over;
   the batch is then marked stripped.
3. each line in order is carried out as a signal row is (a snapshot job is saved with the line's
   key, `file:<batch>:<line>`), then its key is added to the batch's processed keys.
4. the batch is deleted.

A line leaves the file only once the batch holding it is durable (1 before 2). A run that dies
after 1 finds the batch at its next start and finishes it before it reads the file again: step
2 again, which takes the bytes out only if the file still starts with them (once stripped, it
starts with what was appended later), then the lines whose key is neither processed nor the
signal of a saved snapshot job: a line whose job was saved just before a crash is not carried
out twice. The one case the check cannot tell apart: a crash between step 2's rename and its
record, then the very same bytes written at the start of the file again before the next run;
they are taken for the batch's own and dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path

from cdc_core.errors import TerminalError
from cdc_core.signals import SignalProblem
from cdc_core.state import read_json, write_json
from cdc_core.storage import Location, fsync, temporary_for

log = logging.getLogger("cdc_core.signals")

_SHAPE = '{"id": ..., "type": ..., "data": {...}}'


@dataclass(frozen=True)
class FileSignal:
    """One well-formed line of the signal file, as the signal table's `SignalRow` is a row."""

    id: str
    type: str
    data: str | None
    """The JSON of the line's `data`, as the signal table's column holds it; None if absent."""
    key: str
    """`file:<batch>:<line>`: the line itself; ids are only names (Debezium's reuse 'ad-hoc-1')."""


@dataclass(frozen=True)
class Batch:
    """The lines one run took from the signal file, kept in `_state` until all are carried out."""

    id: str
    file: str
    taken: int
    """How many bytes were taken from the start of the file."""
    digest: str
    """The SHA-256 of those bytes: does the file still start with them?"""
    lines: tuple[tuple[int, str], ...]
    """(line number, text) of the lines that are not blank."""
    stripped: bool = False
    processed: tuple[str, ...] = ()

    def key(self, number: int) -> str:
        return f"file:{self.id}:{number}"

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "file": self.file, "taken": self.taken, "digest": self.digest,
            "lines": [list(line) for line in self.lines], "stripped": self.stripped,
            "processed": list(self.processed),
        }  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, object], where: Location) -> Batch:
        try:
            lines = doc["lines"]
            processed = doc.get("processed") or []
            if not isinstance(lines, list) or not isinstance(processed, list):
                raise TypeError("lines and processed are lists")
            return cls(
                str(doc["id"]), str(doc["file"]), int(str(doc["taken"])), str(doc["digest"]),
                tuple((int(n), str(t)) for n, t in lines), bool(doc.get("stripped")),
                tuple(str(k) for k in processed),
            )  # fmt: skip
        except (KeyError, ValueError, TypeError) as e:
            raise TerminalError(
                f"{where} is not a batch of signal file lines ({e!r}): restore it, or remove it "
                "and send its signals again"
            ) from e


def split_lines(data: bytes) -> tuple[int, list[tuple[int, str]]]:
    """How many bytes of the file's `data` to take, and the lines in them that are not blank,
    numbered from 1. A last line without its newline is left for a later run (a writer may be
    half way through it) unless it is complete JSON or blank."""
    end = data.rfind(b"\n") + 1
    rest = data[end:]
    if not rest.strip() or _is_json(rest):
        end = len(data)
    lines = [
        (number, raw.decode("utf-8", errors="replace"))
        for number, raw in enumerate(data[:end].splitlines(), 1)
        if raw.strip()
    ]
    return end, lines


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:  # UnicodeDecodeError included
        return False
    return True


def parse_line(key: str, number: int, text: str, file: str) -> FileSignal | SignalProblem:
    """One line of the file -> a signal to carry out, or why it cannot be."""
    where = f"{file}:{number}"
    try:
        line = json.loads(text)
    except json.JSONDecodeError as e:
        return SignalProblem(where, f"not JSON ({e.msg} at column {e.colno}); write {_SHAPE}")
    if not isinstance(line, dict):
        return SignalProblem(where, f"not a JSON object; write {_SHAPE}")
    signal_id, type_ = line.get("id"), line.get("type")
    if isinstance(signal_id, bool) or not isinstance(signal_id, str | int) or not str(signal_id):
        return SignalProblem(where, f"id is missing or not a string, not {signal_id!r}")
    if not isinstance(type_, str) or not type_.strip():
        return SignalProblem(where, f"type is missing or not a string, not {type_!r}")
    data = line.get("data")
    text_data = None if data is None else data if isinstance(data, str) else json.dumps(data)
    return FileSignal(str(signal_id), type_, text_data, key)


def take_signals(
    path: Path,
    stored: Location,
    carried_out: Collection[str],
    carry_out: Callable[[FileSignal], None],
) -> None:
    """Carry out the signals of the file at `path`, oldest first, each once, through the batch
    kept at `stored` (see the module's steps): first a batch an earlier run left unfinished,
    then the lines in the file now. `carried_out`: keys of signals whose snapshot job was saved
    (by a run that stopped before it recorded them processed)."""
    pending = read_json(stored)
    if pending is not None:
        _finish(stored, Batch.from_json(pending, stored), carried_out, carry_out)
    batch = _take(path, stored)
    if batch is not None:
        _finish(stored, batch, carried_out, carry_out)


def _take(path: Path, stored: Location) -> Batch | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # as Debezium: no file, no signals
        return None
    except OSError as e:
        raise TerminalError(f"cannot read the signal file {path} (signal.file): {e}") from e
    taken, lines = split_lines(data)
    if not taken:
        return None
    digest = hashlib.sha256(data[:taken]).hexdigest()
    batch = Batch(str(time.time_ns()), str(path), taken, digest, tuple(lines))
    write_json(stored, batch.to_json())
    log.info("signal file %s: %d signals taken", path, len(lines))
    return batch


def _finish(
    stored: Location,
    batch: Batch,
    carried_out: Collection[str],
    carry_out: Callable[[FileSignal], None],
) -> None:
    if not batch.stripped:
        _strip(Path(batch.file), batch)
        batch = replace(batch, stripped=True)
        write_json(stored, batch.to_json())
    done = list(batch.processed)
    for number, text in batch.lines:
        key = batch.key(number)
        if key in done or key in carried_out:
            continue
        signal = parse_line(key, number, text, batch.file)
        if isinstance(signal, SignalProblem):
            log.warning("signal %s not carried out: %s", signal.signal_id, signal.reason)
        else:
            carry_out(signal)
        done.append(key)
        write_json(stored, replace(batch, processed=tuple(done)).to_json())
    stored.unlink(missing_ok=True)


def _strip(path: Path, batch: Batch) -> None:
    """Take the batch's bytes out of the start of the file, if they are still there."""
    try:
        with path.open("rb") as old:
            head = old.read(batch.taken)
            if len(head) < batch.taken or hashlib.sha256(head).hexdigest() != batch.digest:
                return  # stripped before a crash, or the file was replaced since
            tmp = temporary_for(path)
            with tmp.open("wb") as new:
                new.write(old.read())
                new.flush()
                os.fsync(new.fileno())
            os.chmod(tmp, stat.S_IMODE(os.fstat(old.fileno()).st_mode))
            os.replace(tmp, path)
            late = old.read()  # appended to the old file after the rest was copied
            if late:
                with path.open("ab") as new:
                    new.write(late)
                    new.flush()
                    os.fsync(new.fileno())
        fsync(path.parent)
    except FileNotFoundError:
        return
    except OSError as e:
        raise TerminalError(
            f"cannot take the signals read out of {path} (signal.file): {e}; the pipeline's "
            "user needs to write the file and its folder. They are recorded: the next run "
            "carries them out and takes them out of the file"
        ) from e
