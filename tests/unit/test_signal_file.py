"""The signal file (`signal.file`): Debezium's line format, and lines taken out of the file only
once recorded in the lake's state, each carried out once whichever step a run dies after."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cdc_core.signal_file import (
    Batch,
    FileSignal,
    _strip,
    _take,
    parse_line,
    split_lines,
    take_signals,
)
from cdc_core.signals import SignalProblem

EXECUTE = {"data-collections": ["public.items"], "type": "incremental"}


def line(signal_id: str, type_: str = "execute-snapshot", data: object = EXECUTE) -> str:
    return json.dumps({"id": signal_id, "type": type_, "data": data}) + "\n"


class Run:
    """One pipeline's signal file and state, and the signals each call carries out."""

    def __init__(self, tmp_path: Path) -> None:
        self.file = tmp_path / "pipelines" / "file-signals.txt"
        self.file.parent.mkdir()
        self.stored = tmp_path / "lake" / "_state" / "signal_file.json"
        self.carried: list[FileSignal] = []

    def write(self, *lines: str) -> None:
        with self.file.open("a") as f:
            f.write("".join(lines))

    def take(self, carried_out: frozenset[str] = frozenset()) -> list[str]:
        """One run's start; the ids carried out by it."""
        before = len(self.carried)
        take_signals(self.file, self.stored, carried_out, self.carried.append)
        return [s.id for s in self.carried[before:]]


def test_a_line_is_a_signal_whose_data_object_is_passed_on_as_json() -> None:
    signal = parse_line("file:1:1", 1, line("s-1").strip(), "/p/file-signals.txt")
    assert signal == FileSignal("s-1", "execute-snapshot", json.dumps(EXECUTE), "file:1:1")


def test_data_written_as_a_json_string_is_taken_as_the_signal_tables_column() -> None:
    text = json.dumps({"id": 7, "type": "log", "data": '{"message": "hi"}'})
    assert parse_line("k", 1, text, "f") == FileSignal("7", "log", '{"message": "hi"}', "k")


def test_a_line_without_data_has_none() -> None:
    assert parse_line("k", 1, '{"id": "a", "type": "log"}', "f") == FileSignal(
        "a", "log", None, "k"
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"id": "a", "type": "log"', "not JSON"),
        ('["a", "log"]', "not a JSON object"),
        ('{"type": "log"}', "id is missing"),
        ('{"id": "", "type": "log"}', "id is missing"),
        ('{"id": "a", "data": {}}', "type is missing"),
        ('{"id": "a", "type": 3}', "type is missing"),
    ],
)
def test_a_bad_line_is_a_problem_naming_the_file_and_line(text: str, reason: str) -> None:
    problem = parse_line("k", 4, text, "/p/file-signals.txt")
    assert isinstance(problem, SignalProblem)
    assert problem.signal_id == "/p/file-signals.txt:4"
    assert reason in problem.reason


def test_blank_lines_are_skipped_but_counted_in_line_numbers() -> None:
    data = (line("a") + "\n  \n" + line("b")).encode()
    taken, lines = split_lines(data)
    assert taken == len(data)
    assert [(n, json.loads(t)["id"]) for n, t in lines] == [(1, "a"), (4, "b")]


def test_a_last_line_still_being_written_is_left_for_a_later_run() -> None:
    data = (line("a") + '{"id": "b", "ty').encode()
    assert split_lines(data) == (len(line("a")), [(1, line("a").strip())])


def test_a_complete_last_line_without_its_newline_is_taken() -> None:
    data = line("a").strip().encode()
    assert split_lines(data) == (len(data), [(1, line("a").strip())])


def test_a_missing_file_holds_no_signals(tmp_path: Path) -> None:
    run = Run(tmp_path)
    assert run.take() == []
    assert not run.stored.exists()


def test_signals_are_carried_out_in_order_once_and_taken_out_of_the_file(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"), line("b", "log", {"message": "hi"}))
    assert run.take() == ["a", "b"]
    assert run.file.read_text() == ""
    assert not run.stored.exists(), "the batch is gone once carried out"
    run.write(line("a"))  # an id used again is a new signal, as in Debezium
    assert run.take() == ["a"]
    assert run.take() == []


def test_a_crash_before_the_file_is_rewritten_loses_and_repeats_nothing(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"), line("b"))
    _take(run.file, run.stored)  # recorded in the state, then the run died
    run.write(line("c"))
    assert run.take() == ["a", "b", "c"]
    assert run.file.read_text() == ""


def test_a_crash_after_the_rewrite_keeps_the_lines_written_since(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"))
    batch = _take(run.file, run.stored)
    assert batch is not None
    _strip(run.file, batch)  # taken out of the file, then the run died before recording it
    run.write(line("b"))
    assert run.take() == ["a", "b"]
    assert run.file.read_text() == ""


def test_a_signal_whose_job_was_saved_before_a_crash_is_not_carried_out_again(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path)
    run.write(line("a"), line("b"))
    batch = _take(run.file, run.stored)
    assert batch is not None
    assert run.take(carried_out=frozenset({batch.key(1)})) == ["b"]


def test_a_batch_records_the_signals_carried_out_one_by_one(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"), line("b"))

    def dies_at_b(signal: FileSignal) -> None:
        if signal.id == "b":
            raise RuntimeError("killed")
        run.carried.append(signal)

    with pytest.raises(RuntimeError):
        take_signals(run.file, run.stored, frozenset(), dies_at_b)
    stored = Batch.from_json(json.loads(run.stored.read_text()), run.stored)
    assert (stored.stripped, stored.processed) == (True, (stored.key(1),))
    assert run.take() == ["b"]
    assert [s.id for s in run.carried] == ["a", "b"]


def test_lines_appended_while_a_batch_is_taken_stay_in_the_file(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"))
    batch = _take(run.file, run.stored)
    assert batch is not None
    run.write(line("b"))  # between the read and the rewrite
    _strip(run.file, batch)
    assert run.file.read_text() == line("b")


def test_a_bad_line_is_logged_once_and_taken_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    run.write("not json\n", line("a"))
    with caplog.at_level(logging.WARNING, logger="cdc_core.signals"):
        assert run.take() == ["a"]
        assert run.take() == []
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"signal {run.file}:1 not carried out: not JSON" in warning
    assert run.file.read_text() == ""


def test_the_rewritten_file_keeps_its_permissions(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.write(line("a"))
    run.file.chmod(0o664)
    run.take()
    assert run.file.stat().st_mode & 0o777 == 0o664
