"""The least-privilege role the product runs as in the integration tier, granted as README.md
("Permissions") tells users to grant it: never a superuser.

Tests set up and change the source as the superuser (DDL, workloads, ground-truth slots); the
product (ingest, `cdc` commands, Spark JDBC snapshot reads, validate) connects as `PRODUCT_ROLE`:
LOGIN REPLICATION, CONNECT and CREATE on the database, USAGE on its schemas, and membership of
`REPLICATION_GROUP`, which owns the tables. Ownership is what PostgreSQL asks of whoever adds a
table to a publication (and sets REPLICA IDENTITY); the group shares it between the tables'
original owner (here the superuser that created them) and the product, Debezium's documented
way. Its password (`PASSWORD`, distinctive so tests can search output and files for it) reaches
the product only through the environment (`${CDC_TEST_PG_PASSWORD}` in the pipeline file).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_core.pg.local import LocalPostgres

PRODUCT_ROLE = "cdc_lake"
REPLICATION_GROUP = "cdc_replication"
PASSWORD_VAR = "CDC_TEST_PG_PASSWORD"
PASSWORD = "Lq7-cdc-lake-NEVER-SHOWN-x9Vd"

# Each table the superuser creates once the product is set up goes to the group, as a DBA's
# migration would do it (ALTER TABLE ... OWNER TO), by an event trigger; each new schema gets
# USAGE for the product. Only a creator that is a member of the group may hand a table to it:
# other roles' tables stay theirs, as they would on a real server.
_OWN_NEW_TABLES = """
CREATE OR REPLACE FUNCTION cdc_test_share_ownership() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE created record;
BEGIN
  IF NOT pg_has_role({group_text}, 'MEMBER') THEN RETURN; END IF;
  FOR created IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
    IF created.object_type = 'table' AND created.schema_name NOT LIKE 'pg\\_temp%' THEN
      EXECUTE format('ALTER TABLE %s OWNER TO %I', created.object_identity, {group_text});
    ELSIF created.object_type = 'schema' THEN
      EXECUTE format('GRANT USAGE ON SCHEMA %s TO %I', created.object_identity, {role_text});
    END IF;
  END LOOP;
END $$;
"""
_TRIGGER = """
CREATE EVENT TRIGGER cdc_test_share_ownership ON ddl_command_end
WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'CREATE SCHEMA')
EXECUTE FUNCTION cdc_test_share_ownership()
"""
# Tables and schemas that exist already (created before the product was set up).
_EXISTING = """
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE c.relkind IN ('r', 'p') AND c.relowner = current_user::regrole
             AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_'
  LOOP EXECUTE format('ALTER TABLE %s OWNER TO %I', r.t, {group_text}); END LOOP;
  FOR r IN SELECT nspname FROM pg_namespace
           WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname !~ '^pg_'
  LOOP EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', r.nspname, {role_text}); END LOOP;
END $$;
"""


def _texts() -> dict[str, sql.Composable]:
    return {"group_text": sql.Literal(REPLICATION_GROUP), "role_text": sql.Literal(PRODUCT_ROLE)}


def ensure_roles(admin_dsn: str) -> None:
    """The product's role and the replication group on the server (roles are server-wide)."""
    role, group = sql.Identifier(PRODUCT_ROLE), sql.Identifier(REPLICATION_GROUP)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        existing = {
            r[0]
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                ([PRODUCT_ROLE, REPLICATION_GROUP],),
            )
        }
        if REPLICATION_GROUP not in existing:
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(group))
        if PRODUCT_ROLE not in existing:
            conn.execute("SET password_encryption = 'scram-sha-256'")  # 13's default is md5
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                    role, sql.Literal(PASSWORD)
                )
            )
            conn.execute(sql.SQL("GRANT {} TO {}").format(group, role))
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(group))  # the tables' owner


def product_dsn(admin_dsn: str) -> str:
    """The product's DSN for `admin_dsn`'s database, its password as `${CDC_TEST_PG_PASSWORD}`;
    grants what the product needs there first (idempotent, cheap)."""
    ensure_roles(admin_dsn)
    role = sql.Identifier(PRODUCT_ROLE)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        database = sql.Identifier(str(conn.info.dbname))
        conn.execute(sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}").format(database, role))
        installed = conn.execute(
            "SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdc_test_share_ownership'"
        ).fetchone()
        if installed is None:
            conn.execute(sql.SQL(_OWN_NEW_TABLES).format(**_texts()))
            conn.execute(_TRIGGER)
        conn.execute(sql.SQL(_EXISTING).format(**_texts()))
    return make_conninfo(admin_dsn, user=PRODUCT_ROLE, password=f"${{{PASSWORD_VAR}}}")


def product_conninfo(admin_dsn: str) -> str:
    """The same DSN with the password in it: for the environment, or a direct connection."""
    return make_conninfo(product_dsn(admin_dsn), password=PASSWORD)


def require_password(cluster: LocalPostgres) -> None:
    """Make the cluster (trust for everyone else) ask `PRODUCT_ROLE` for its password, so a
    product that did not pass it on, to psycopg or to Spark's JDBC reads, cannot connect."""
    hba = cluster.data_dir / "pg_hba.conf"
    lines = [
        f"host {db} {PRODUCT_ROLE} 127.0.0.1/32 scram-sha-256" for db in ("all", "replication")
    ]
    hba.write_text("\n".join(lines) + "\n" + hba.read_text())
    admin = cluster.dsn()
    ensure_roles(admin)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the reload is asynchronous
        try:
            psycopg.connect(make_conninfo(admin, user=PRODUCT_ROLE, password="wrong")).close()
        except psycopg.OperationalError as e:
            if "password authentication failed" in str(e):
                return
            raise
        time.sleep(0.05)
    raise AssertionError(f"{hba} still lets {PRODUCT_ROLE} in without its password")


def files_holding_password(root: Path) -> list[str]:
    """Files under `root` that hold `PASSWORD`; Parquet is also read back (its pages are
    compressed: a byte search alone could miss it)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".parquet":
            parquet = pq.ParquetFile(path)
            data += repr((parquet.read().to_pylist(), parquet.metadata.metadata)).encode()
        if PASSWORD.encode() in data:
            found.append(str(path.relative_to(root)))
    return found
