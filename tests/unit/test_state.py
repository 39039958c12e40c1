"""The pipeline's own state documents under `_state/`."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_core.errors import TerminalError
from cdc_core.lake import Lake
from cdc_core.lsn import Lsn
from cdc_core.pg.slot import SlotState
from cdc_core.start import holds_position
from cdc_core.state import (
    check_owner,
    damaged_documents,
    owner_file,
    pruned_positions,
    read_json,
    read_stream,
    record_confirmed,
    record_pruned,
    schema_history,
    schemas_dir,
    stream_file,
)


def test_the_recorded_stream_position_never_moves_back_for_its_slot(tmp_path: Path) -> None:
    """A run confirms past WAL that holds nothing captured (beyond its last staged file); the
    next run starts from that file and confirms it first. Recording that lower position would
    leave the slot ahead of the record, which the next start reads as a recreated slot and
    refuses (what `make crash` seed 20261122 hit after a kill at capture.transaction)."""
    lake = Lake(str(tmp_path))
    record_confirmed(lake, "s", Lsn.parse("0/3000"))
    record_confirmed(lake, "s", Lsn.parse("0/2000"))  # a new run's first confirmation
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/3000"}
    record_confirmed(lake, "s", Lsn.parse("0/4000"))
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/4000"}
    record_confirmed(lake, "other", Lsn.parse("0/1000"))  # another slot: its own position
    assert read_json(stream_file(lake)) == {"slot": "other", "confirmed": "0/1000"}


def test_a_table_s_pruned_position_only_moves_forward(tmp_path: Path) -> None:
    """Bronze retention records how far it deleted each table's rows before it deletes them; a
    later, smaller deletion must not make an earlier one look undone."""
    lake = Lake(str(tmp_path))
    assert pruned_positions(lake) == {}
    record_pruned(lake, {"public.a": (500, 1)})
    record_pruned(lake, {"public.a": (300, 0), "public.b": (700, 2)})
    assert pruned_positions(lake) == {"public.a": (500, 1), "public.b": (700, 2)}
    record_pruned(lake, {"public.a": (500, 3)})
    assert pruned_positions(lake) == {"public.a": (500, 3), "public.b": (700, 2)}


def test_the_cluster_a_position_was_recorded_on_is_kept_with_it(tmp_path: Path) -> None:
    """The first position (a run's start) is recorded with the source's system identifier;
    capture's later ones, which do not read it, keep it."""
    lake = Lake(str(tmp_path))
    record_confirmed(lake, "s", Lsn.parse("0/3000"), "77")
    record_confirmed(lake, "s", Lsn.parse("0/4000"))
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/4000", "system": "77"}
    record_confirmed(lake, "s", Lsn.parse("0/3800"))  # never back
    assert read_json(stream_file(lake)) == {"slot": "s", "confirmed": "0/4000", "system": "77"}
    record_confirmed(lake, "other", Lsn.parse("0/1000"))  # another slot: not known where
    assert read_json(stream_file(lake)) == {"slot": "other", "confirmed": "0/1000"}


def test_the_timeline_a_position_was_read_on_is_kept_with_it_and_follows_a_new_one(
    tmp_path: Path,
) -> None:
    """Each position is recorded with the timeline capture read it on; one that does not know
    it keeps the record's; a later timeline (a failover in the position's history) replaces it,
    even at the same position."""
    lake = Lake(str(tmp_path))
    record_confirmed(lake, "s", Lsn.parse("0/3000"), "77", 1)
    record_confirmed(lake, "s", Lsn.parse("0/4000"))
    stored = {"slot": "s", "confirmed": "0/4000", "system": "77", "timeline": 1}
    assert read_json(stream_file(lake)) == stored
    record_confirmed(lake, "s", Lsn.parse("0/4000"), timeline=2)
    assert read_json(stream_file(lake)) == stored | {"timeline": 2}


def _slot(confirmed: str, wal_status: str = "reserved") -> SlotState:
    return SlotState("s", Lsn.parse(confirmed), None, wal_status, None)


def test_a_slot_holds_the_stored_position_only_on_the_cluster_it_was_recorded_on() -> None:
    """A slot of the same name behind the stored position passes every other test on another
    cluster (a fresh one's LSNs are small): reading from it would take the changes between
    its position and the stored one for staged already, and skip them without a word."""
    stored = {"slot": "s", "confirmed": "0/5000", "system": "77"}
    assert holds_position(_slot("0/4000"), stored, "77")
    assert not holds_position(_slot("0/4000"), stored, "78")
    assert holds_position(_slot("0/4000"), stored, None)  # the server does not show it
    assert holds_position(_slot("0/4000"), {"slot": "s", "confirmed": "0/5000"}, "78")  # older
    assert not holds_position(_slot("0/6000"), stored, "77")  # ahead: recreated
    assert not holds_position(_slot("0/4000", "lost"), stored, "77")
    assert not holds_position(None, stored, "77")
    assert holds_position(_slot("0/9000"), None, "77")  # a first run adopts the slot


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{"table": "public.t", "first_lsn": 1',
            "JSONDecodeError: Expecting ',' delimiter: line 1 column 37 (char 36)",
        ),
        ('{"table": "public.t", "first_lsn": 1}', "KeyError: 'descriptor'"),
        ("[]", "TypeError: list indices must be integers or slices, not str"),
    ],
    ids=["cut-short", "no-shape", "not-an-object"],
)
def test_a_damaged_schema_history_entry_is_named_with_the_way_out(
    tmp_path: Path, text: str, said: str
) -> None:
    """The schema history is the lake's record of the shapes the stream sent: an entry damaged
    since it was written stops the reader of the history naming it, not an unexpected error."""
    lake = Lake(str(tmp_path / "lake"))
    entry = schemas_dir(lake) / "0123-0000000000000001.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(text)
    with pytest.raises(TerminalError) as failed:
        schema_history(lake, "public.t")
    assert str(failed.value) == (
        f"{entry} is not a schema history entry ({said}): it records a captured table's shape "
        "as the stream sent it, which reading its changes needs and the server cannot send "
        "again; restore it from a backup of the lake"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"slot": "s", "conf', "JSONDecodeError: Unterminated string starting at: line 1 column 15 (char 14)"),
        ("null", "it holds no slot and position"),
        ("[]", "it holds no slot and position"),
        ("{}", "KeyError: 'slot'"),
        ('{"slot": "s"}', "KeyError: 'confirmed'"),
        ('{"slot": "s", "confirmed": "garbage"}', "ValueError: 'garbage' is not an LSN"),
    ],
    ids=["cut-short", "null", "a-list", "empty", "no-position", "not-a-position"],
)  # fmt: skip
def test_a_damaged_stream_record_is_named_and_never_read_as_no_record(
    tmp_path: Path, text: str, why: str
) -> None:
    """`null` or `{}` used to read as no record at all, and a run then took whatever position
    the slot had, without the check that it did not pass changes the lake never got."""
    lake = Lake(str(tmp_path / "lake"))
    stream_file(lake).parent.mkdir(parents=True)
    stream_file(lake).write_text(text)
    with pytest.raises(TerminalError) as failed:
        read_stream(lake)
    message = str(failed.value)
    assert message.startswith(f"{stream_file(lake)} is not a stream position record ({why}")
    assert message.endswith(
        "): restore it from a backup of the lake. Failing that, remove it and run once with "
        "snapshot.mode: always (every table read again): a run without it cannot tell whether "
        "the slot passed changes the lake never got"
    )
    stream_file(lake).unlink()
    assert read_stream(lake) is None  # before the first position
    record_confirmed(lake, "s", Lsn(16))
    assert read_stream(lake) == {"slot": "s", "confirmed": "0/10"}


def test_every_document_a_run_would_stop_on_is_named_in_the_run_s_words(tmp_path: Path) -> None:
    """`cdc status` lists them, so that a damaged document is a problem before the next run
    stops on it; the documents read leniently or by readers of their own are not listed."""
    lake = Lake(str(tmp_path / "lake"))
    (lake.state / "requests").mkdir(parents=True)
    (schemas_dir(lake)).mkdir()
    for name in ("tables.json", "requests/1.json", "schemas/0123-0000000000000001.json",
                 "run.holder.json", "stream.json"):  # fmt: skip
        (lake.state / name).write_text('{"a": ')
    (lake.state / "catalog.json").write_text("{}")  # sound ones are not listed
    (lake.state / "metrics.prom").write_text("{")  # nor what is not a JSON document

    found = damaged_documents(lake)

    assert [why.split(" ")[0] for why in found] == [
        str(lake.state / "tables.json"), str(lake.state / "requests" / "1.json"),
        str(schemas_dir(lake) / "0123-0000000000000001.json"),
    ]  # fmt: skip
    with pytest.raises(TerminalError) as failed:
        read_json(lake.state / "tables.json")
    assert found[0] == str(failed.value)
    assert "is not a schema history entry" in found[2]
    assert damaged_documents(Lake(str(tmp_path / "none"))) == []


@pytest.mark.parametrize("text", ["[]", "{}", '{"pipeline": 7}', "null"])
def test_a_damaged_ownership_record_stops_the_run_and_is_never_claimed_over(
    tmp_path: Path, text: str
) -> None:
    """It used to read as a lake no pipeline owns, which the first run of any pipeline took."""
    lake = Lake(str(tmp_path / "lake"))
    owner_file(lake).parent.mkdir(parents=True)
    owner_file(lake).write_text(text)
    with pytest.raises(TerminalError) as failed:
        check_owner(lake, "orders", claim=True)
    assert str(failed.value) == (
        f"{owner_file(lake)} does not name the pipeline whose lake this is (it holds {text}): "
        "restore it from a backup of the lake, or, if this is pipeline 'orders''s lake, remove "
        "it and run again"
    )
    assert owner_file(lake).read_text() == text
    owner_file(lake).unlink()
    check_owner(lake, "orders", claim=True)
    assert read_json(owner_file(lake)) == {"pipeline": "orders"}
