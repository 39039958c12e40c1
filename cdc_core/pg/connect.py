"""Regular and replication connections to the source (psycopg 3); errors keep secrets out."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import make_conninfo

from cdc_core.config import Dsn
from cdc_core.errors import TransientError

APPLICATION_NAME = "cdc-lake"
CONNECT_TIMEOUT_S = 10

# Output settings for every session that reads values (pgoutput formats values with the
# walsender session's settings): the same text whatever the server's defaults are.
VALUE_SETTINGS = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "lc_monetary": "C",
}
VALUE_OPTIONS = " ".join(f"-c {k}={v}" for k, v in VALUE_SETTINGS.items())


def connect(
    dsn: Dsn, *, autocommit: bool = True, replication: bool = False, values: bool = False
) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection; `replication=True` opens a logical replication (walsender) session,
    `values=True` a session that formats values with `VALUE_SETTINGS` (replication implies it).

    A server that cannot be reached is a `TransientError` (it may be restarting); the message
    shows the connection string without its password.
    """
    conninfo = make_conninfo(
        dsn.conninfo,
        application_name=APPLICATION_NAME,
        connect_timeout=CONNECT_TIMEOUT_S,
        **({"replication": "database"} if replication else {}),
        **({"options": VALUE_OPTIONS} if replication or values else {}),
    )
    try:
        return psycopg.connect(conninfo, autocommit=autocommit)
    except psycopg.OperationalError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TransientError(f"cannot connect to PostgreSQL at {dsn.redacted}: {reason}") from e
