"""Passwords reach the product from the environment or a secrets file, never from the pipeline
file in clear, and no message shows them."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_core.config import Config, Dsn, load_pipeline
from cdc_core.errors import ConfigError, TerminalError
from cdc_core.pg.connect import connect
from tests.unit.test_config import CONTRACT, write_home

PASSWORD = "p w'@/\\x-Zq8"  # a space, a quote, URI delimiters and a backslash


def load(tmp_path: Path, dsn: str, environ: dict[str, str], extra: str = "") -> Config:
    pipeline = CONTRACT.replace(
        "  dsn: ${ORDERS_PG_DSN:-postgresql://postgres@127.0.0.1:5432/shop}\n",
        f"  dsn: {dsn}\n{extra}",
    )
    return load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ=environ)


def refused(tmp_path: Path, dsn: str, environ: dict[str, str], extra: str = "") -> str:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, dsn, environ, extra)
    return str(e.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://cdc:hunter2@db:5432/shop",
        "postgresql://cdc@db:5432/shop?sslmode=require&password=hunter2",
        "'host=db user=cdc password=hunter2 dbname=shop'",
        "${ORDERS_PG_DSN:-postgresql://cdc:hunter2@db/shop}",
    ],
)
def test_a_password_written_in_the_pipeline_file_is_refused_without_showing_it(
    tmp_path: Path, dsn: str
) -> None:
    message = refused(tmp_path, dsn, {})
    assert message.startswith("pipelines/orders.yaml: source.dsn: the connection string holds")
    assert "source.password_file" in message
    assert "hunter2" not in message


@pytest.mark.parametrize(
    ("dsn", "environ"),
    [
        ("postgresql://cdc:${PG_PASSWORD}@db/shop", {"PG_PASSWORD": "hunter2"}),
        ("'host=db user=cdc password=${PG_PASSWORD}'", {"PG_PASSWORD": "hunter2"}),
        ("${ORDERS_PG_DSN}", {"ORDERS_PG_DSN": "postgresql://cdc:hunter2@db/shop"}),
        (
            "${ORDERS_PG_DSN:-postgresql://cdc:hunter2@db/shop}",
            {"ORDERS_PG_DSN": "postgresql://cdc:other@db/shop"},
        ),
    ],
)
def test_a_password_from_the_environment_is_taken(
    tmp_path: Path, dsn: str, environ: dict[str, str]
) -> None:
    dsn_loaded = load(tmp_path, dsn, environ).pipeline.source.dsn
    assert conninfo_to_dict(dsn_loaded.conninfo)["password"] in ("hunter2", "other")
    assert "hunter2" not in str(dsn_loaded)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://cdc:${PG_PASSWORD}@db:5432/shop",  # as cdc import-debezium writes it
        "postgresql://${PG_USER}:${PG_PASSWORD}@${PG_HOSTS}/shop",
        "postgresql://cdc@${PG_HOSTS}/shop?sslmode=prefer&password=${PG_PASSWORD}",
        "'host=db user=cdc password=${PG_PASSWORD} dbname=shop'",
    ],
)
def test_a_password_from_the_environment_means_its_text_wherever_it_goes(
    tmp_path: Path, dsn: str
) -> None:
    """The environment holds the password itself, which a URI needs percent-encoded and a
    key=value string quoted: "Secr3t/x9" read as port "Secr3t", "a@b" as host "b"."""
    environ = {"PG_PASSWORD": PASSWORD, "PG_USER": "cdc", "PG_HOSTS": "db:5432,db2:5433"}
    loaded = load(tmp_path, dsn, environ).pipeline.source.dsn
    params = conninfo_to_dict(loaded.conninfo)
    assert params["password"] == PASSWORD
    assert params["user"] == "cdc"
    assert params["dbname"] == "shop"
    assert params["host"] in ("db", "db,db2")  # a host list from the environment as it is
    assert "Zq8" not in str(loaded)
    assert "Zq8" not in repr(loaded)


def test_a_query_string_from_the_environment_is_taken_as_it_is_and_a_value_in_it_encoded(
    tmp_path: Path,
) -> None:
    """`?${PG_PARAMS}` holds settings, `a=b&c=d`: encoded, its `=` and `&` meant nothing."""
    environ = {"PG_PARAMS": "sslmode=require&connect_timeout=5", "PG_PASSWORD": PASSWORD}
    dsn = "postgresql://cdc@db/shop?${PG_PARAMS}&password=${PG_PASSWORD}"
    params = conninfo_to_dict(load(tmp_path, dsn, environ).pipeline.source.dsn.conninfo)
    assert (params["sslmode"], params["connect_timeout"]) == ("require", "5")
    assert params["password"] == PASSWORD


@pytest.mark.parametrize("dsn", ["postgresql://cdc@db:5432/shop", "'host=db user=cdc'"])
def test_a_password_file_gives_the_password_quoted_for_libpq(tmp_path: Path, dsn: str) -> None:
    secret = tmp_path / "pg_password"
    secret.write_text(PASSWORD + "\n")
    config = load(
        tmp_path, dsn, {"SECRETS": str(tmp_path)}, "  password_file: ${SECRETS}/pg_password\n"
    )
    loaded = config.pipeline.source.dsn
    assert conninfo_to_dict(loaded.conninfo)["password"] == PASSWORD
    assert "Zq8" not in f"{loaded} {loaded!r} {config!r}"


def test_a_password_file_that_is_missing_or_doubles_the_dsn_password_is_refused(
    tmp_path: Path,
) -> None:
    missing = refused(
        tmp_path, "postgresql://cdc@db/shop", {}, "  password_file: /nonexistent/pw\n"
    )
    assert missing == (
        "pipelines/orders.yaml: source.password_file: cannot read '/nonexistent/pw': "
        "No such file or directory (a file holding only the password)"
    )
    (tmp_path / "pw").write_text("x")
    both = refused(
        tmp_path, "postgresql://cdc:${PW}@db/shop", {"PW": "hunter2"},
        f"  password_file: {tmp_path / 'pw'}\n",
    )  # fmt: skip
    assert both.endswith("source.password_file: source.dsn holds a password already: keep one")


def test_a_malformed_connection_string_is_not_quoted_in_the_error() -> None:
    with pytest.raises(TerminalError) as e:
        connect(Dsn("host=db user=cdc password=two words"))
    assert "words" not in str(e.value)
    assert str(e.value).startswith("source.dsn is not a valid connection string:")
    assert e.value.__cause__ is None
    with pytest.raises(psycopg.ProgrammingError, match='after "words"'):  # what libpq would say
        psycopg.connect("host=db user=cdc password=two words")
