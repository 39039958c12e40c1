"""Which connect failures retrying will not fix: the texts are what psycopg 3.3 / libpq 18 gave
on a PostgreSQL 18 throwaway cluster (each with `sqlstate` None: libpq reports a failed connect
as text), so the classifier is checked on the server's own words. "starting up" is the one
not captured (PostgreSQL's wording, as `cdc_core.transient` has it); PostgreSQL 13's is
PostgreSQL 13.23's, which `tests/integration/test_pg_versions.py` meets for real."""

from __future__ import annotations

import psycopg
import pytest

from cdc_core.config import Dsn
from cdc_core.errors import EXIT_FAILURE, LoginError, TransientError
from cdc_core.pg.connect import connect, refusal

AT = 'connection failed: connection to server at "127.0.0.1", port 44201 failed: '
PERMANENT = {
    "no database": AT + 'FATAL:  database "nosuchdb" does not exist',
    "no role": AT + 'FATAL:  role "nosuchuser" does not exist',
    "wrong password": AT + 'FATAL:  password authentication failed for user "pw"',
    "no password": AT + "fe_sendauth: no password supplied",
    "pg_hba.conf reject": AT + 'FATAL:  pg_hba.conf rejects connection for host "127.0.0.1", '
    'user "rejected", database "postgres", no encryption',
    "no pg_hba.conf entry": AT + 'FATAL:  no pg_hba.conf entry for host "127.0.0.1", user '
    '"nohba", database "postgres", no encryption',
    "NOLOGIN": AT + 'FATAL:  role "nologin" is not permitted to log in',
    "CONNECT revoked": AT + 'FATAL:  permission denied for database "noconn"\n'
    "DETAIL:  User does not have CONNECT privilege.",
    "PostgreSQL 13": AT + 'FATAL:  unrecognized configuration parameter "idle_session_timeout"',
}
PASSING = {
    "server down": AT + "Connection refused\n\tIs the server running on that host and "
    "accepting TCP/IP connections?",
    "shutting down": AT + "FATAL:  the database system is shutting down",
    "starting up": AT + "FATAL:  the database system is starting up",
    "too many clients": AT + "FATAL:  sorry, too many clients already",
    "role connection limit": AT + 'FATAL:  too many connections for role "pw"',
    "cut off": AT + "server closed the connection unexpectedly\n\tThis probably means the "
    "server terminated abnormally\n\tbefore or while processing the request.",
    "unknown host": "failed to resolve host 'no-such-host.invalid': [Errno -2] Name or service "
    "not known",
}


@pytest.mark.parametrize("message", PERMANENT.values(), ids=PERMANENT.keys())
def test_a_refused_login_is_recognised(message: str) -> None:
    assert refusal(message) is not None


@pytest.mark.parametrize("message", PASSING.values(), ids=PASSING.keys())
def test_a_failure_that_may_pass_is_not_a_refusal(message: str) -> None:
    assert refusal(message) is None


def _failing_with(monkeypatch: pytest.MonkeyPatch, message: str) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError(message)

    monkeypatch.setattr(psycopg, "connect", fail)


def test_a_missing_database_is_terminal_naming_it_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _failing_with(monkeypatch, PERMANENT["no database"])
    with pytest.raises(LoginError) as refused:
        connect(Dsn("postgresql://cdc:hunter2@127.0.0.1:44201/nosuchdb"))
    assert refused.value.exit_code == EXIT_FAILURE  # not 75: a retry would fail the same way
    assert str(refused.value) == (
        "cannot connect to PostgreSQL at postgresql://cdc:***@127.0.0.1:44201/nosuchdb: "
        + PERMANENT["no database"]
        + "; retrying will not help: source.dsn: correct the user or database name"
    )


def test_a_server_shutting_down_stays_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_with(monkeypatch, PASSING["shutting down"])
    with pytest.raises(TransientError, match="the database system is shutting down"):
        connect(Dsn("postgresql://cdc:hunter2@127.0.0.1:44201/shop"))
