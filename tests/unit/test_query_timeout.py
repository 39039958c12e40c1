"""`source.query_timeout_s` (Debezium's `database.query.timeout.ms`): loaded and refused like any
key, carried by the DSN to every regular session as `statement_timeout` and to snapshot chunk
reads as JDBC `queryTimeout`, never to the replication stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_core.config import Dsn, load_pipeline
from cdc_core.pg.connect import connect, statement_timeout
from cdc_core.snapshot_read import jdbc_target
from cdc_core.transient import as_transient
from tests.unit.test_config import CONTRACT, load_error, write_home

DSN = "postgresql://cdc@127.0.0.1:5432/shop"


def _source(tmp_path: Path, extra: str = "") -> Any:
    pipeline = CONTRACT.replace("  tables:", f"{extra}  tables:") if extra else CONTRACT
    home = write_home(tmp_path, pipeline)
    return load_pipeline("orders", "local", home=home, environ={}).pipeline.source


def test_the_default_is_debeziums_ten_minutes_and_the_dsn_carries_it(tmp_path: Path) -> None:
    source = _source(tmp_path)
    assert source.query_timeout_s == 600.0
    assert source.dsn.query_timeout_s == 600.0


def test_a_fraction_of_a_second_and_zero_load(tmp_path: Path) -> None:
    assert _source(tmp_path, "  query_timeout_s: 0.25\n").dsn.query_timeout_s == 0.25
    assert _source(tmp_path, "  query_timeout_s: 0\n").dsn.query_timeout_s == 0.0


def test_a_password_from_a_file_keeps_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    source = _source(tmp_path, f"  password_file: {tmp_path / 'pw'}\n  query_timeout_s: 5\n")
    assert source.dsn.has_password
    assert source.dsn.query_timeout_s == 5.0


@pytest.mark.parametrize(
    ("seconds", "why"),
    [
        ("-1", "-1.0 is negative: give the seconds a query may run, or 0 for no limit"),
        ("2147484", "2147484.0 is more than PostgreSQL's statement_timeout takes (2147483 s, "
                    "about 24 days): give fewer seconds, or 0 for no limit"),
    ],
)  # fmt: skip
def test_a_timeout_postgresql_cannot_take_is_refused_naming_the_key(
    tmp_path: Path, seconds: str, why: str
) -> None:
    """Past statement_timeout's 32-bit milliseconds, every connection failed and the run
    exited 75 ("retry") for a value no retry fixes."""
    message = load_error(
        tmp_path, CONTRACT.replace("  tables:", f"  query_timeout_s: {seconds}\n  tables:")
    )
    assert message.endswith(f"source.query_timeout_s: {why}")


@pytest.mark.parametrize("value", ["ten", "true", ".nan", "[1]"])
def test_a_timeout_that_is_not_a_number_is_refused_naming_the_key(
    tmp_path: Path, value: str
) -> None:
    message = load_error(
        tmp_path, CONTRACT.replace("  tables:", f"  query_timeout_s: {value}\n  tables:")
    )
    assert ": source.query_timeout_s: expected a" in message


def test_statement_timeout_is_whole_milliseconds_rounded_up() -> None:
    assert statement_timeout(600) == "600000"
    assert statement_timeout(0.0001) == "1"  # never 0, which would mean no limit
    assert statement_timeout(0) == "0"


def _sessions(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    opened: list[dict[str, str]] = []

    def record(conninfo: str, **_: object) -> None:
        opened.append({k: str(v) for k, v in conninfo_to_dict(conninfo).items()})

    monkeypatch.setattr(psycopg, "connect", record)
    return opened


def test_regular_sessions_are_bounded_and_the_stream_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = _sessions(monkeypatch)
    dsn = Dsn(DSN, query_timeout_s=2.5)
    connect(dsn)
    connect(dsn, values=True)
    connect(dsn, bounded=False)
    connect(dsn, replication=True)
    connect(Dsn(DSN))
    options = [o["options"] for o in opened]
    assert options[0].endswith("-c statement_timeout=2500")
    assert options[1].endswith("-c statement_timeout=2500")
    assert options[2].endswith("-c statement_timeout=0")  # the peek, cdc validate: no limit
    assert "statement_timeout" not in options[3]
    assert options[4].endswith("-c statement_timeout=0")


def test_a_snapshot_chunk_read_gets_the_jdbc_query_timeout_in_whole_seconds() -> None:
    assert jdbc_target(Dsn(DSN, query_timeout_s=2.5))[1]["queryTimeout"] == "3"
    assert "queryTimeout" not in jdbc_target(Dsn(DSN, query_timeout_s=0))[1]


def test_a_cancelled_query_is_transient_and_names_the_key() -> None:
    error = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    error.sqlstate = "57014"  # type: ignore[misc]  # set by the server on a real one
    mapped = as_transient(error)
    assert mapped is not None
    assert mapped.exit_code == 75
    assert str(mapped).startswith("a query on the source ran past source.query_timeout_s")
    assert "raise source.query_timeout_s (0: no limit)" in str(mapped)
