"""`cdc doctor` against a real PostgreSQL: each check passes on a good source and names the fix."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_core.config import ByteSize, Config, load_pipeline
from cdc_core.errors import SetupError, TerminalError
from cdc_core.identifiers import TableName
from cdc_core.pg import catalog
from cdc_core.pg.connect import APPLICATION_NAME, connect
from cdc_core.pg.doctor import Check, DoctorReport, format_report, run_doctor
from cdc_core.pg.local import LocalPostgres, free_port, throwaway_cluster
from cdc_core.pg.pgoutput import ReplicaIdentity
from cdc_core.pg.slot import ensure_publication
from tests.conftest import unavailable
from tests.integration import privileges
from tests.integration.conftest import PgServer
from tests.integration.harness import slot_reader

SHOP = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint REFERENCES customers, total numeric);
"""
ROLE_PASSWORD = "doctor-test"
ROLE_PASSWORD_VAR = "CDC_DOCTOR_PASSWORD"


def make_config(
    home: Path,
    dsn: str,
    tables: Sequence[str] = ("public.customers", "public.orders"),
    *,
    slot: str = "orders_cdc",
    publication: str = "orders_cdc",
    sections: dict[str, dict[str, str]] | None = None,
) -> Config:
    """A pipeline `orders` and an environment `local` written under `home`, loaded as the CLI does;
    `sections` adds keys (e.g. {"snapshot": {"signal.data.collection": ...}})."""
    (home / "pipelines").mkdir(exist_ok=True)
    (home / "conf").mkdir(exist_ok=True)
    source = {"dsn": dsn, "slot": slot, "publication": publication, "tables": list(tables)}
    pipeline: dict[str, object] = {"name": "orders", "source": source}
    for key, values in (sections or {}).items():
        pipeline[key] = {**source, **values} if key == "source" else values
    pipeline["target"] = {"root": str(home / "lake")}
    (home / "pipelines" / "orders.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (home / "conf" / "local.yaml").write_text("spark:\n  master: local[1]\n")
    environ = {ROLE_PASSWORD_VAR: ROLE_PASSWORD, privileges.PASSWORD_VAR: privileges.PASSWORD}
    return load_pipeline("orders", "local", home=home, environ=environ)


def check(report: DoctorReport, name: str) -> Check:
    found = [c for c in report.checks if c.name == name]
    assert found, f"no check {name!r} in {[c.name for c in report.checks]}"
    return found[0]


def failed(report: DoctorReport) -> list[str]:
    return [c.name for c in report.checks if c.status == "fail"]


def run(pg: PgServer | LocalPostgres, dbname: str, statements: str) -> None:
    """Run SQL as the superuser."""
    with psycopg.connect(pg.dsn(dbname), autocommit=True) as conn:
        conn.execute(statements.encode())  # several statements: the simple query protocol


def role_dsn(pg: PgServer, dbname: str, user: str) -> str:
    """The role's conninfo, its password from the environment (the server may not ask for it)."""
    return make_conninfo(pg.dsn(dbname, user=user), password=f"${{{ROLE_PASSWORD_VAR}}}")


@pytest.fixture
def shop(pg: PgServer, database: str) -> str:
    run(pg, database, SHOP)
    return database


@pytest.fixture
def role(pg: PgServer, database: str) -> Iterator[str]:
    """A LOGIN role without REPLICATION or any grant; dropped with what it owns."""
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    create = sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}")
    pg.execute(create.format(sql.Identifier(name), sql.Literal(ROLE_PASSWORD)))
    yield name
    drop_owned = sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name))
    pg.execute(drop_owned, database)
    pg.execute(drop_owned)
    pg.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_well_set_up_source_passes_every_check(pg: PgServer, shop: str, tmp_path: Path) -> None:
    report = run_doctor(make_config(tmp_path, pg.product_dsn(shop)))  # the README's grants

    assert failed(report) == []
    assert report.ok
    assert [c.name for c in report.checks] == [
        "connect", "server_version", "primary", "wal_level", "max_replication_slots",
        "max_wal_senders",
        "replication_role", "replication_connection", "publication", "slot", "other_slots",
        "table public.customers", "table public.orders",
        "replica_identity public.customers", "replica_identity public.orders", "encoding",
    ]  # fmt: skip
    assert {c.status for c in report.checks} == {"pass"}
    assert check(report, "primary").detail == "not in recovery"
    assert check(report, "replication_role").detail == '"cdc_lake" has REPLICATION'
    assert check(report, "replica_identity public.orders").detail == 'primary key ("id")'
    assert format_report(report).endswith(f"{len(report.checks)} passed, 0 failed")


def test_a_table_without_primary_key_fails_until_replica_identity_full(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, "CREATE TABLE events (at timestamptz, payload jsonb)")
    config = make_config(tmp_path, pg.dsn(shop), ["public.orders", "public.events"])

    first = check(run_doctor(config), "replica_identity public.events")
    assert first.status == "fail"
    assert "no primary key" in first.detail
    assert first.fix is not None
    fix = first.fix.splitlines()[0]
    assert fix == 'ALTER TABLE "public"."events" REPLICA IDENTITY FULL;'

    run(pg, shop, fix)
    again = run_doctor(config)
    assert check(again, "replica_identity public.events").status == "pass"
    assert again.ok


def test_a_primary_key_with_replica_identity_nothing_fails(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, "ALTER TABLE orders REPLICA IDENTITY NOTHING")

    result = check(
        run_doctor(make_config(tmp_path, pg.dsn(shop))), "replica_identity public.orders"
    )

    assert result.status == "fail"
    assert result.fix == 'ALTER TABLE "public"."orders" REPLICA IDENTITY DEFAULT;'


SKUS = """
    CREATE TABLE skus (code text NOT NULL, region text NOT NULL, price numeric);
    CREATE UNIQUE INDEX skus_code_region ON skus (code, region);
    ALTER TABLE skus REPLICA IDENTITY USING INDEX skus_code_region;
"""


def test_replica_identity_using_a_unique_index_passes_when_the_table_is_keyed_by_it(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, SKUS)
    keyed = {"source": {"message.key.columns": "public.skus:code,region"}}

    report = run_doctor(make_config(tmp_path, pg.dsn(shop), ["public.skus"], sections=keyed))

    result = check(report, "replica_identity public.skus")
    assert result.status == "pass"
    assert result.detail == 'USING INDEX skus_code_region ("code", "region")'


def test_a_table_without_a_key_under_using_index_fails_with_full(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, SKUS)  # deletes carry only (code, region): whole rows would never match

    result = check(
        run_doctor(make_config(tmp_path, pg.dsn(shop), ["public.skus"])),
        "replica_identity public.skus",
    )

    assert result.status == "fail"
    assert "no primary key and REPLICA IDENTITY USING INDEX skus_code_region" in result.detail
    assert "the mirror would keep deleted rows" in result.detail
    assert result.fix is not None
    assert result.fix.splitlines() == [
        'ALTER TABLE "public"."skus" REPLICA IDENTITY FULL;',
        "or pipelines/orders.yaml: source.message.key.columns: public\\.skus:code,region",
    ]


def test_a_primary_key_outside_the_using_index_fails_with_default(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, """
        ALTER TABLE customers ADD COLUMN email text NOT NULL DEFAULT '';
        CREATE UNIQUE INDEX customers_email ON customers (email);
        ALTER TABLE customers REPLICA IDENTITY USING INDEX customers_email;
    """)  # fmt: skip
    config = make_config(tmp_path, pg.dsn(shop))

    result = check(run_doctor(config), "replica_identity public.customers")

    assert result.status == "fail"
    assert result.detail.startswith(
        "key column id of public.customers is not in its replica identity "
        "(USING INDEX customers_email (email))"
    )
    assert result.fix is not None
    fix = result.fix.splitlines()[0]
    assert fix == 'ALTER TABLE "public"."customers" REPLICA IDENTITY DEFAULT;'
    run(pg, shop, fix)
    assert run_doctor(config).ok


def test_a_missing_table_is_named_with_a_close_match(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    report = run_doctor(make_config(tmp_path, pg.dsn(shop), ["public.customers", "public.ordrs"]))

    missing = check(report, "table public.ordrs")
    assert missing.status == "fail"
    assert missing.detail == "public.ordrs does not exist (did you mean public.orders?)"
    assert missing.fix is not None
    assert missing.fix.endswith("source.tables: write public.orders instead of public.ordrs")
    assert check(report, "replica_identity public.ordrs").status == "skip"
    assert failed(report) == ["table public.ordrs"]


def test_an_unlogged_table_fails_and_a_run_stops_on_it_in_one_line(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Its changes never reach the WAL: PostgreSQL refuses it in a publication, so the run
    would stop on that as an unexpected error after the doctor passed it."""
    from tests.integration.harness import make_pipeline, sql

    dsn = pg.dsn(database)
    sql(
        dsn,
        "CREATE TABLE kept (id int PRIMARY KEY)",
        "CREATE UNLOGGED TABLE ul (id int PRIMARY KEY)",
    )
    report = run_doctor(make_config(tmp_path, dsn, ["public.kept", "public.ul"]))
    result = check(report, "table public.ul")
    assert result.status == "fail"
    assert result.detail.startswith("unlogged table: its changes are not written to the WAL")
    assert result.fix is not None
    assert result.fix.startswith('ALTER TABLE "public"."ul" SET LOGGED;')
    assert failed(report) == ["table public.ul"]

    p = make_pipeline(tmp_path / "run", dsn, ["public.kept", "public.ul"])
    stopped = p.ingest("--capture-only")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    [line] = [s for s in stopped.stderr.splitlines() if s.startswith("error:")]
    assert "table public.ul: unlogged table" in line
    assert "unexpected" not in stopped.stderr
    sql(dsn, result.fix.split(";")[0])  # the statement the fix gives
    assert run_doctor(make_config(tmp_path, dsn, ["public.kept", "public.ul"])).ok


def test_a_role_without_replication_fails_with_the_alter_role_fix(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(pg, shop, f'GRANT SELECT ON customers, orders TO "{role}"')
    config = make_config(tmp_path, role_dsn(pg, shop, role))

    report = run_doctor(config)
    result = check(report, "replication_role")
    assert result.status == "fail"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == f'ALTER ROLE "{role}" WITH REPLICATION;'
    assert check(report, "replication_connection").status == "skip"

    run(pg, shop, result.fix.splitlines()[0])
    again = run_doctor(config)
    assert check(again, "replication_role").status == "pass"
    assert check(again, "replication_connection").status == "pass"


def test_a_role_without_select_gets_the_grant(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    report = run_doctor(make_config(tmp_path, role_dsn(pg, shop, role), ["public.orders"]))

    result = check(report, "table public.orders")
    assert result.status == "fail"
    assert result.fix == f'GRANT SELECT ON "public"."orders" TO "{role}";'


def test_a_quoted_schema_and_table_name_work_in_queries_and_fixes(
    pg: PgServer, database: str, role: str, tmp_path: Path
) -> None:
    run(
        pg,
        database,
        'CREATE SCHEMA "Sales"; CREATE TABLE "Sales"."Order Items" (sku text, qty int)',
    )
    table = '"Sales"."Order Items"'
    report = run_doctor(make_config(tmp_path, role_dsn(pg, database, role), [table]))

    assert check(report, f"table {table}").fix == "\n".join([
        f'GRANT USAGE ON SCHEMA "Sales" TO "{role}";',
        f'GRANT SELECT ON "Sales"."Order Items" TO "{role}";',
    ])  # fmt: skip
    identity = check(report, f"replica_identity {table}")
    assert identity.fix is not None
    assert identity.fix.splitlines()[0] == f"ALTER TABLE {table} REPLICA IDENTITY FULL;"
    publication = check(report, "publication")
    assert publication.fix is not None
    assert (
        publication.fix.splitlines()[0] == f'CREATE PUBLICATION "orders_cdc" FOR TABLE ONLY {table}'
        " WITH (publish_via_partition_root = true);"
    )


def test_a_quoted_table_with_a_key_passes_for_a_superuser(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    run(
        pg,
        database,
        'CREATE SCHEMA "Sales"; CREATE TABLE "Sales"."Order Items" (id int PRIMARY KEY)',
    )

    report = run_doctor(make_config(tmp_path, pg.dsn(database), ['"Sales"."Order Items"']))

    assert failed(report) == []
    assert check(report, 'table "Sales"."Order Items"').status == "pass"


def test_a_partitioned_table_published_by_its_root_counts_as_published(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    run(pg, database, """
        CREATE TABLE readings (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
        CREATE TABLE readings_2024 PARTITION OF readings FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
        CREATE PUBLICATION orders_cdc FOR TABLE readings;
    """)  # fmt: skip
    config = make_config(tmp_path, pg.dsn(database), ["public.readings"])

    # Without publish_via_partition_root, changes come under the partitions' names.
    report = run_doctor(config)
    assert failed(report) == ["publication"]
    publication = check(report, "publication")
    assert publication.detail == (
        '"orders_cdc" publishes 1 of 1 tables; it sends the changes of partitioned table '
        "public.readings under its partitions' names (publish_via_partition_root is off): the "
        "pipeline would miss them"
    )
    assert publication.fix == (
        'ALTER PUBLICATION "orders_cdc" SET (publish_via_partition_root = true);'
    )

    run(pg, database, publication.fix)
    report = run_doctor(config)
    assert failed(report) == []
    assert check(report, "table public.readings").detail == "partitioned table, SELECT granted"
    assert check(report, "publication").detail == '"orders_cdc" publishes 1 of 1 tables'
    assert check(report, "replica_identity public.readings").detail == 'primary key ("id", "at")'


def test_a_partition_s_own_replica_identity_must_carry_what_the_mirror_matches_by(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """A partition's replica identity is its own, and its changes are sent under the
    partitioned table's name: a keyless table's partition keyed by its own primary key sends
    only that key (the multiset mirror keeps deleted rows), one under DEFAULT without a key
    makes the source refuse its UPDATE and DELETE, and one using another index sends no key."""
    run(pg, database, """
        CREATE TABLE loose (id int NOT NULL, v text) PARTITION BY RANGE (id);
        CREATE TABLE loose_1 PARTITION OF loose FOR VALUES FROM (0) TO (100);
        CREATE TABLE loose_2 PARTITION OF loose FOR VALUES FROM (100) TO (200)
            PARTITION BY RANGE (id);
        CREATE TABLE loose_2a PARTITION OF loose_2 FOR VALUES FROM (100) TO (200);
        ALTER TABLE loose REPLICA IDENTITY FULL;
        ALTER TABLE loose_2a REPLICA IDENTITY FULL;
        CREATE TABLE keyed (id int PRIMARY KEY, v text NOT NULL) PARTITION BY RANGE (id);
        CREATE TABLE keyed_1 PARTITION OF keyed FOR VALUES FROM (0) TO (100);
        CREATE UNIQUE INDEX keyed_1_v ON keyed_1 (v);
        ALTER TABLE keyed_1 REPLICA IDENTITY USING INDEX keyed_1_v;
    """)  # fmt: skip
    tables = ["public.loose", "public.keyed", "public.keyed_1"]
    report = run_doctor(make_config(tmp_path, pg.dsn(database), tables))

    assert failed(report) == [f"replica_identity {t}" for t in tables]
    loose, keyed, listed = (check(report, f"replica_identity {t}") for t in tables)
    assert (loose.detail, loose.fix) == (
        "partition loose_1 of public.loose has REPLICA IDENTITY DEFAULT without a primary key, "
        "its own: the source refuses its UPDATEs and DELETEs while public.loose is published",
        "ALTER TABLE loose_1 REPLICA IDENTITY FULL (and so for each partition created later)",
    )
    assert (keyed.detail, keyed.fix) == (
        "partition keyed_1 of public.keyed has REPLICA IDENTITY USING INDEX keyed_1_v (v), its "
        "own: its deletes and key changes would carry only v, and the mirror of public.keyed "
        "matches rows by id, so it would keep deleted rows",
        "ALTER TABLE keyed_1 REPLICA IDENTITY DEFAULT",
    )
    assert (listed.detail, listed.fix) == (
        "table public.keyed_1 is a partition of public.keyed, which the pipeline captures too: "
        "its changes are sent as public.keyed's (publish_via_partition_root), so its own mirror "
        "would never change",
        "leave public.keyed_1 out of source.tables",
    )
    with (
        psycopg.connect(pg.dsn(database), autocommit=True) as conn,
        pytest.raises(TerminalError) as refused,
    ):
        ensure_publication(conn, "orders_cdc", [TableName("public", "loose")], "filtered")
    assert str(refused.value) == f"{loose.detail}. Run {loose.fix}"  # before publishing it

    run(pg, database, loose.fix.partition(" (")[0] + "; ALTER TABLE loose_1 ADD PRIMARY KEY (id)")
    assert failed(run_doctor(make_config(tmp_path, pg.dsn(database), ["public.loose"]))) == []
    run(pg, database, "ALTER TABLE loose_1 REPLICA IDENTITY DEFAULT")  # by its own key now
    report = run_doctor(make_config(tmp_path, pg.dsn(database), ["public.loose"]))
    assert check(report, "replica_identity public.loose").detail == (
        "partition loose_1 of public.loose has REPLICA IDENTITY DEFAULT (the primary key id), its "
        "own: its deletes and key changes would carry only id, and the mirror of public.loose "
        "matches rows by whole rows (it has no primary key), so it would keep deleted rows"
    )
    run(pg, database, "ALTER TABLE loose_1 REPLICA IDENTITY FULL")
    assert failed(run_doctor(make_config(tmp_path, pg.dsn(database), ["public.loose"]))) == []
    with psycopg.connect(pg.dsn(database), autocommit=True) as conn:
        ensure_publication(conn, "orders_cdc", [TableName("public", "loose")], "filtered")


def test_the_catalog_reads_keys_in_key_order_and_the_identity_index(
    pg: PgServer, database: str
) -> None:
    run(pg, database, """
        CREATE TABLE lines (a int, b text NOT NULL, c numeric(12,2), PRIMARY KEY (b, a));
        CREATE TABLE tags (k text NOT NULL, v text);
        CREATE UNIQUE INDEX tags_k ON tags (k);
        ALTER TABLE tags REPLICA IDENTITY USING INDEX tags_k;
        CREATE VIEW lines_view AS SELECT * FROM lines;
    """)  # fmt: skip
    lines, tags, view = (TableName("public", n) for n in ("lines", "tags", "lines_view"))
    with psycopg.connect(pg.dsn(database)) as conn:
        info = catalog.table_info(conn, [lines, tags, view])
        columns = catalog.table_columns(conn, lines)

    assert info[view] is None
    line_info, tag_info = info[lines], info[tags]
    assert line_info is not None
    assert tag_info is not None
    assert line_info.primary_key == ("b", "a")
    assert line_info.identity_columns == ("b", "a")
    assert (line_info.kind, line_info.can_select, line_info.is_owner) == ("ordinary", True, True)
    assert tag_info.replica_identity is ReplicaIdentity.INDEX
    assert (tag_info.primary_key, tag_info.identity_columns) == ((), ("k",))
    assert [(c.name, c.type_name, c.not_null) for c in columns] == [
        ("a", "integer", True),
        ("b", "text", True),
        ("c", "numeric(12,2)", False),
    ]


def test_a_missing_publication_needs_create_on_the_database(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(pg, shop, f'ALTER TABLE customers OWNER TO "{role}"; ALTER TABLE orders OWNER TO "{role}"')
    config = make_config(tmp_path, role_dsn(pg, shop, role))

    result = check(run_doctor(config), "publication")
    assert result.status == "fail"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == f'GRANT CREATE ON DATABASE "{shop}" TO "{role}";'

    run(pg, shop, result.fix.splitlines()[0])
    assert check(run_doctor(config), "publication").status == "pass"


def test_an_existing_publication_missing_a_table_needs_its_owner(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(
        pg,
        shop,
        f'CREATE PUBLICATION orders_cdc FOR TABLE customers; GRANT SELECT ON orders TO "{role}"',
    )
    config = make_config(tmp_path, role_dsn(pg, shop, role))

    result = check(run_doctor(config), "publication")
    assert result.status == "fail"
    assert result.detail.startswith('"orders_cdc" publishes 1 of 2 tables')
    assert result.fix is not None
    assert (
        result.fix.splitlines()[0]
        == 'ALTER PUBLICATION "orders_cdc" ADD TABLE ONLY "public"."orders";'
    )

    run(pg, shop, result.fix.splitlines()[0])  # as the superuser that owns both
    fixed = check(run_doctor(config), "publication")
    assert fixed.status == "pass"
    assert fixed.detail == '"orders_cdc" publishes 2 of 2 tables; used as it is (owner "postgres")'


@pytest.mark.parametrize("mode", ["disabled", "all_tables"])
def test_a_publication_lacking_tables_fails_when_the_mode_adds_none(
    pg: PgServer, shop: str, tmp_path: Path, mode: str
) -> None:
    # Only `filtered` adds tables to an existing publication; the other modes stop the run
    # (start_publication.unpublished), so the doctor fails and gives the statement to run.
    run(pg, shop, "CREATE PUBLICATION orders_cdc FOR TABLE customers")
    config = make_config(
        tmp_path, pg.dsn(shop), sections={"source": {"publication.autocreate.mode": mode}}
    )

    result = check(run_doctor(config), "publication")
    assert result.status == "fail"
    assert result.detail == (
        f'"orders_cdc" publishes 1 of 2 tables; publication.autocreate.mode {mode} adds no table '
        "to an existing publication: a run stops until public.orders is added"
    )
    assert result.fix is not None
    assert (
        result.fix.splitlines()[0]
        == 'ALTER PUBLICATION "orders_cdc" ADD TABLE ONLY "public"."orders";'
    )


def test_a_publication_owner_may_add_the_tables_it_owns_without_owning_the_others(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    # ADD TABLE needs ownership of the publication and of the tables added, not of the tables
    # the publication already lists (customers stays the superuser's).
    run(
        pg,
        shop,
        "CREATE PUBLICATION orders_cdc FOR TABLE customers;"
        f' ALTER PUBLICATION orders_cdc OWNER TO "{role}"; ALTER TABLE orders OWNER TO "{role}";'
        f' GRANT SELECT ON customers TO "{role}"',
    )
    config = make_config(tmp_path, role_dsn(pg, shop, role))

    result = check(run_doctor(config), "publication")
    assert (result.status, result.detail) == (
        "pass",
        '"orders_cdc" publishes 1 of 2 tables; the product adds the others'
        " (ALTER PUBLICATION ... ADD TABLE)",
    )

    tables = [TableName("public", "customers"), TableName("public", "orders")]
    with connect(config.pipeline.source.dsn) as conn:  # as the role
        ensure_publication(conn, "orders_cdc", tables, "filtered")
    assert check(run_doctor(config), "publication").detail == '"orders_cdc" publishes 2 of 2 tables'


def test_a_publication_without_updates_fails(pg: PgServer, shop: str, tmp_path: Path) -> None:
    run(
        pg,
        shop,
        "CREATE PUBLICATION orders_cdc FOR TABLE customers, orders WITH (publish = 'insert')",
    )

    result = check(run_doctor(make_config(tmp_path, pg.dsn(shop))), "publication")

    assert result.status == "fail"
    assert "does not publish update, delete, truncate: those changes would never reach" in (
        result.detail
    )
    assert result.fix == (
        "ALTER PUBLICATION \"orders_cdc\" SET (publish = 'insert, update, delete, truncate');\n"
        "or leave them out of the mirrors: pipelines/orders.yaml: source.skipped.operations: u,d,t"
    )


def test_a_publication_without_truncate_fails_unless_the_pipeline_skips_truncate(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, "CREATE PUBLICATION orders_cdc FOR TABLE customers, orders "
                  "WITH (publish = 'insert, update, delete')")  # fmt: skip

    result = check(run_doctor(make_config(tmp_path, pg.dsn(shop))), "publication")
    assert result.status == "fail"
    assert "does not publish truncate: those changes would never reach the mirrors" in (
        result.detail
    )
    assert result.fix.endswith("source.skipped.operations: t")

    skipping = make_config(tmp_path, pg.dsn(shop), sections={"source": {"skipped.operations": "t"}})
    assert check(run_doctor(skipping), "publication").status == "pass"


def test_a_row_filter_or_column_list_on_a_captured_table_fails_until_published_whole(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    run(pg, shop, "CREATE PUBLICATION orders_cdc FOR TABLE customers WHERE (id > 5 AND name <> 'x'), "
                  "orders (id, customer_id)")  # fmt: skip
    config = make_config(tmp_path, pg.dsn(shop))

    result = check(run_doctor(config), "publication")

    assert result.status == "fail"
    assert ("it publishes only the rows of public.customers WHERE ((id > 5) AND (name <> 'x'::text))"
            ": a snapshot reads them all") in result.detail  # fmt: skip
    assert "it publishes only columns id, customer_id of public.orders: the mirror" in result.detail
    *statements, note = result.fix.splitlines()
    assert note.startswith("(the next run snapshots each table published anew")
    assert len(statements) == 2
    for statement in statements:  # the fix as printed makes the publication whole
        run(pg, shop, statement)
    assert check(run_doctor(config), "publication").status == "pass"


def test_an_existing_pgoutput_slot_passes(pg: PgServer, shop: str, tmp_path: Path) -> None:
    run(pg, shop, "SELECT pg_create_logical_replication_slot('orders_cdc', 'pgoutput')")

    report = run_doctor(make_config(tmp_path, pg.dsn(shop)))

    assert check(report, "slot").detail == '"orders_cdc" exists: logical, pgoutput, inactive'
    assert check(report, "max_replication_slots").status == "pass"


def test_a_slot_another_process_reads_fails_and_one_a_run_of_ours_reads_passes(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    """After an import from Debezium with the connector still attached: every run exits 75
    until it lets go of the slot, and the doctor passed it."""
    run(pg, shop, "CREATE PUBLICATION held FOR TABLE customers")
    run(pg, shop, "SELECT pg_create_logical_replication_slot('orders_cdc', 'pgoutput')")
    config = make_config(tmp_path, pg.dsn(shop))
    with slot_reader(pg.dsn(shop), "orders_cdc", "held", APPLICATION_NAME) as pid:
        ours = check(run_doctor(config), "slot")
    with slot_reader(pg.dsn(shop), "orders_cdc", "held", "debezium") as pid:
        theirs = check(run_doctor(config), "slot")

    assert ours.status == "pass"
    assert ours.detail.startswith('"orders_cdc" exists: logical, pgoutput, active (pid ')
    assert theirs.status == "fail"
    assert theirs.detail == (
        f'"orders_cdc" is read now by another process (pid {pid}, application_name '
        "'debezium'), not by a run of this pipeline: a run exits 75 (to be retried) until it "
        "lets go of the slot"
    )
    assert theirs.fix is not None
    assert theirs.fix.endswith(f"end its session: SELECT pg_terminate_backend({pid});")


def test_idle_slots_that_keep_wal_are_a_warning_with_the_way_out(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    """A slot left by a retired pipeline or a test fills the source's disk as surely as the
    pipeline's own: the doctor names those that keep more than source.retained_wal_warn."""
    run(pg, shop, "SELECT pg_create_logical_replication_slot('left_behind', 'pgoutput');"
        "SELECT pg_create_logical_replication_slot('orders_cdc', 'pgoutput')")  # fmt: skip
    run(pg, shop, "INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 2000) g")

    def kept() -> int:
        with psycopg.connect(pg.dsn(shop)) as conn:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = 'left_behind'"
            ).fetchone()
        assert row is not None
        return int(row[0])

    before = kept()
    assert before > 64 * 1024
    low = make_config(tmp_path, pg.dsn(shop), sections={"source": {"retained_wal_warn": "64KiB"}})
    result = check(run_doctor(low), "other_slots")
    after = kept()  # the server writes WAL meanwhile too (autovacuum's analyze of the insert)

    assert result.status == "warn"
    shown = re.search(r'"left_behind" ([0-9.]+ KiB) ', result.detail)
    assert shown is not None, result.detail
    low_end, high_end = ByteSize(before).readable(), ByteSize(after).readable()
    assert float(low_end[:-4]) <= float(shown[1][:-4]) <= float(high_end[:-4]), result.detail
    assert result.detail == (  # the pipeline's own slot (orders_cdc) is the slot check's
        "1 other idle slot (no process reads it now) keeps more than 64.0 KiB of WAL "
        f'(source.retained_wal_warn): "left_behind" {shown[1]} (logical, database '
        f'"{shop}"); the server keeps that WAL until each is read or dropped'
    )
    assert result.fix is not None
    assert "cdc retire --pipeline NAME --yes" in result.fix
    assert "SELECT pg_drop_replication_slot('left_behind');" in result.fix
    default = check(run_doctor(make_config(tmp_path, pg.dsn(shop))), "other_slots")
    assert default.status == "pass"  # it keeps less than 1 GiB
    assert default.detail == (
        "no other idle slot keeps more than 1.0 GiB of WAL (source.retained_wal_warn)"
    )


def test_a_physical_slot_of_the_same_name_fails(pg: PgServer, shop: str, tmp_path: Path) -> None:
    slot = f"phys_{uuid.uuid4().hex[:8]}"  # physical slots belong to no database: drop it here
    run(pg, shop, f"SELECT pg_create_physical_replication_slot('{slot}')")
    try:
        result = check(run_doctor(make_config(tmp_path, pg.dsn(shop), slot=slot)), "slot")
    finally:
        run(pg, shop, f"SELECT pg_drop_replication_slot('{slot}')")

    assert result.status == "fail"
    assert result.detail == f'"{slot}" is a physical slot'
    assert result.fix is not None
    assert result.fix.splitlines()[0] == f"SELECT pg_drop_replication_slot('{slot}');"


def test_a_database_not_in_utf8_fails(pg: PgServer, tmp_path: Path) -> None:
    name = f"latin_{uuid.uuid4().hex[:8]}"
    pg.execute(
        f"CREATE DATABASE {name} ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    try:
        run(pg, name, SHOP)
        result = check(run_doctor(make_config(tmp_path, pg.dsn(name))), "encoding")
    finally:
        pg.drop_database(name)

    assert result.status == "fail"
    assert result.detail.startswith("LATIN1")
    assert result.fix is not None
    assert result.fix.splitlines()[0] == (
        f"CREATE DATABASE \"{name}\" WITH ENCODING 'UTF8' TEMPLATE template0;"
    )


def test_an_unreachable_server_fails_the_connect_check_and_skips_the_rest(tmp_path: Path) -> None:
    dsn = f"postgresql://cdc:${{{ROLE_PASSWORD_VAR}}}@127.0.0.1:{free_port()}/shop"

    report = run_doctor(make_config(tmp_path, dsn))

    first, *rest = report.checks
    assert first.name == "connect"
    assert first.status == "fail"
    assert "postgresql://cdc:***@127.0.0.1" in first.detail
    assert ROLE_PASSWORD not in format_report(report)
    assert {c.status for c in rest} == {"skip"}
    assert "table public.orders" in [c.name for c in rest]
    assert not report.ok


@pytest.fixture(scope="module")
def small_server() -> Iterator[LocalPostgres]:
    """wal_level=replica and room for one slot and one WAL sender."""
    settings = {"wal_level": "replica", "max_replication_slots": "1", "max_wal_senders": "1"}
    try:
        with throwaway_cluster("doctor-small", extra=settings) as cluster:
            run(cluster, "postgres", SHOP)
            yield cluster
    except SetupError as e:
        unavailable(f"cannot start a local PostgreSQL: {e}")


def test_wal_level_replica_fails_with_the_alter_system_fix(
    small_server: LocalPostgres, tmp_path: Path
) -> None:
    report = run_doctor(make_config(tmp_path, small_server.dsn()))

    result = check(report, "wal_level")
    assert result.status == "fail"
    assert result.detail == "replica; logical decoding needs logical"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == "ALTER SYSTEM SET wal_level = logical;"
    assert "      fix: ALTER SYSTEM SET wal_level = logical;" in format_report(report)
    assert failed(report) == ["wal_level"]


def test_no_free_replication_slot_fails_with_a_higher_limit(
    small_server: LocalPostgres, tmp_path: Path
) -> None:
    run(small_server, "postgres", "SELECT pg_create_physical_replication_slot('someone_else')")
    try:
        result = check(
            run_doctor(make_config(tmp_path, small_server.dsn())), "max_replication_slots"
        )
    finally:
        run(small_server, "postgres", "SELECT pg_drop_replication_slot('someone_else')")

    assert result.status == "fail"
    assert result.detail == "1 of 1 in use: none free for this pipeline"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == "ALTER SYSTEM SET max_replication_slots = 2;"


def test_no_free_wal_sender_fails_with_a_higher_limit(
    small_server: LocalPostgres, tmp_path: Path
) -> None:
    with psycopg.connect(small_server.dsn(), replication="database", autocommit=True):
        report = run_doctor(make_config(tmp_path, small_server.dsn()))

    result = check(report, "max_wal_senders")
    assert result.status == "fail"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == "ALTER SYSTEM SET max_wal_senders = 2;"
    connection = check(report, "replication_connection")
    assert connection.status == "fail"
    assert connection.fix == "free a WAL sender, or raise max_wal_senders (see that check)"


def test_wal_level_passes_once_the_fix_is_applied_and_the_server_restarted(tmp_path: Path) -> None:
    try:
        with throwaway_cluster("doctor-replica", extra={"wal_level": "replica"}) as cluster:
            run(cluster, "postgres", SHOP)
            config = make_config(tmp_path, cluster.dsn())
            fix = check(run_doctor(config), "wal_level").fix
            assert fix is not None
            run(cluster, "postgres", fix.splitlines()[0])
            run(cluster, "postgres", "SELECT pg_reload_conf()")
            pending = check(run_doctor(config), "wal_level")
            cluster.restart()
            after = run_doctor(config)
    except SetupError as e:
        unavailable(f"cannot start a local PostgreSQL: {e}")

    assert pending.detail == "replica; a new value is set and waits for a restart"
    assert check(after, "wal_level").detail == "logical"
    assert after.ok


def test_a_role_refused_connect_on_the_database_gets_the_grant(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(pg, shop, f'REVOKE CONNECT ON DATABASE "{shop}" FROM PUBLIC')

    result = check(run_doctor(make_config(tmp_path, role_dsn(pg, shop, role))), "connect")

    assert result.status == "fail"
    assert result.fix is not None
    assert result.fix.splitlines()[0] == f'GRANT CONNECT ON DATABASE "{shop}" TO "{role}";'
    run(pg, shop, result.fix.splitlines()[0])
    assert check(run_doctor(make_config(tmp_path, role_dsn(pg, shop, role))), "connect").status == (
        "pass"
    )


def test_autoset_on_a_table_the_role_does_not_own_fails_naming_its_owner(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(pg, shop, f'ALTER ROLE "{role}" REPLICATION; GRANT SELECT ON customers, orders TO "{role}"')
    autoset = {"source": {"replica.identity.autoset.values": "public.orders:FULL"}}
    config = make_config(tmp_path, role_dsn(pg, shop, role), sections=autoset)

    result = check(run_doctor(config), "replica_identity public.orders")
    assert result.status == "fail"
    assert "sets FULL on every run" in result.detail
    assert result.detail.endswith('does not own the table (owner "postgres")')
    assert result.fix is not None
    assert result.fix.splitlines()[0] == 'ALTER TABLE "public"."orders" REPLICA IDENTITY FULL;'
    assert check(run_doctor(config), "replica_identity public.customers").status == "pass"

    run(pg, shop, result.fix.splitlines()[0])  # once, as the owner: the run leaves it alone
    assert check(run_doctor(config), "replica_identity public.orders").status == "pass"


def test_a_signal_table_the_role_cannot_read_gets_the_grant(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    run(pg, shop, "CREATE TABLE debezium_signal (id text PRIMARY KEY, type text, data text)")
    signals = {"snapshot": {"signal.data.collection": "public.debezium_signal"}}
    config = make_config(tmp_path, role_dsn(pg, shop, role), sections=signals)

    result = check(run_doctor(config), "signal_table")
    assert result.status == "fail"
    assert result.fix == f'GRANT SELECT ON "public"."debezium_signal" TO "{role}";'
    run(pg, shop, result.fix)
    assert check(run_doctor(config), "signal_table").detail == (
        "public.debezium_signal, SELECT granted"
    )


def test_guardrail_collections_max_passes_warns_or_fails_by_the_captured_tables(
    pg: PgServer, shop: str, tmp_path: Path
) -> None:
    """Debezium's guardrail.collections.max and limit.action, on listed and on found tables."""

    def guardrail(most: int, action: str = "warn", found: str | None = None) -> Check:
        source = {"guardrail.collections.max": str(most),
                  "guardrail.collections.limit.action": action}  # fmt: skip
        tables: Sequence[str] = ("public.customers", "public.orders")
        if found is not None:  # no tables listed: those the include list lets through
            source, tables = source | {"table.include.list": found}, ()
        config = make_config(tmp_path, pg.product_dsn(shop), tables, sections={"source": source})
        return check(run_doctor(config), "guardrail")

    within = guardrail(2)
    assert (within.status, within.detail) == (
        "pass", "2 tables captured, at most 2 (guardrail.collections.max)"
    )  # fmt: skip
    past = guardrail(1)
    assert (past.status, past.detail) == (
        "warn", "source.tables lists 2 tables, more than guardrail.collections.max (1)"
    )  # fmt: skip
    assert "narrow source.tables, or raise source.guardrail.collections.max" in past.fix
    assert guardrail(1, "fail").status == "fail"
    found = guardrail(1, "fail", found=r"public\..*")
    assert found.detail == (
        "source.table.include.list lets 2 tables through, more than guardrail.collections.max (1)"
    )


def test_a_run_past_guardrail_collections_max_stops_before_it_reads_or_warns_and_goes_on(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    from tests.integration.harness import make_pipeline, sql

    dsn = pg.dsn(database)
    sql(dsn, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    p = make_pipeline(tmp_path, dsn, ["public.a", "public.b"], source_extra=(
        "guardrail.collections.max: 1\nguardrail.collections.limit.action: fail\n"
    ))  # fmt: skip
    stopped = p.ingest("--capture-only")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert "guardrail: source.tables lists 2 tables, more than guardrail.collections.max (1)" in (
        stopped.stderr
    )
    with psycopg.connect(dsn) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             (p.slot,)).fetchone()  # fmt: skip
    assert slots == (0,)  # nothing was set up on the source
    p.edit("limit.action: fail", "limit.action: warn")
    warned = p.ingest("--capture-only")
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert "guardrail: source.tables lists 2 tables, more than guardrail.collections.max (1)" in (
        warned.stderr
    )


def test_row_level_security_that_filters_the_role_s_reads_fails_until_it_reads_every_row(
    pg: PgServer, shop: str, role: str, tmp_path: Path
) -> None:
    """The stream sends every change whatever the policies say; a snapshot read through them
    would be short of rows, silently. The doctor refuses the table, and a reading session
    (row_security off) fails rather than read the rows the policies let through."""
    run(pg, shop, f"""
        INSERT INTO customers VALUES (1, 'shown'), (2, 'hidden'), (3, 'hidden');
        GRANT SELECT ON customers TO "{role}";
        ALTER TABLE customers ENABLE ROW LEVEL SECURITY;
        CREATE POLICY only_shown ON customers FOR SELECT USING (name = 'shown');
    """)  # fmt: skip
    dsn = role_dsn(pg, shop, role)
    config = make_config(tmp_path, dsn, ["public.customers"])

    result = check(run_doctor(config), "table public.customers")

    assert result.status == "fail"
    assert f'row-level security filters the rows "{role}" reads of it' in result.detail
    assert result.fix.splitlines()[:2] == [
        f'ALTER ROLE "{role}" BYPASSRLS; (as a superuser)',
        'or ALTER TABLE "public"."customers" DISABLE ROW LEVEL SECURITY;',
    ]
    with connect(config.pipeline.source.dsn) as conn:  # an application's session: filtered
        assert conn.execute("SELECT count(*) FROM customers").fetchone() == (1,)
    with (
        connect(config.pipeline.source.dsn, values=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"),
    ):
        conn.execute("SELECT count(*) FROM customers")

    run(pg, shop, f'ALTER ROLE "{role}" BYPASSRLS')
    assert check(run_doctor(config), "table public.customers").status == "pass"
    with connect(config.pipeline.source.dsn, values=True) as conn:
        assert conn.execute("SELECT count(*) FROM customers").fetchone() == (3,)


def test_a_message_key_no_unique_index_keeps_unique_is_warned_of(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Rows that share a message.key.columns key become one mirror row: said, unless the
    primary key or a whole-table unique index on columns lies within the key."""
    run(pg, database, """
        CREATE TABLE bare (id int PRIMARY KEY, code text, v text);
        CREATE TABLE partial (id int PRIMARY KEY, code text, v text);
        CREATE UNIQUE INDEX ON partial (code) WHERE v IS NOT NULL;
        CREATE TABLE lowered (id int PRIMARY KEY, code text, v text);
        CREATE UNIQUE INDEX ON lowered (lower(code));
        CREATE TABLE uniq (id int PRIMARY KEY, "Code" text, v text);
        CREATE UNIQUE INDEX ON uniq ("Code") INCLUDE (v);
        CREATE TABLE wider (id int PRIMARY KEY, code text UNIQUE, v text);
        CREATE TABLE pk_within (id int PRIMARY KEY, code text, v text);
    """)  # fmt: skip
    tables = ["public.bare", "public.partial", "public.lowered", "public.uniq", "public.wider",
              "public.pk_within"]  # fmt: skip
    keys = {"message.key.columns": "public.(bare|partial|lowered):code;public.uniq:Code;"
                                   "public.wider:code,v;public.pk_within:id,code"}  # fmt: skip
    for t in tables:
        run(pg, database, f'ALTER TABLE "{t.split(".")[1]}" REPLICA IDENTITY FULL')
    report = run_doctor(make_config(tmp_path, pg.dsn(database), tables,
                                    sections={"source": keys}))  # fmt: skip
    warned = [c for c in report.checks if c.name.startswith("message key")]
    assert [(c.name, c.status) for c in warned] == [
        ("message key public.bare", "warn"), ("message key public.partial", "warn"),
        ("message key public.lowered", "warn"),
    ]  # fmt: skip
    assert warned[0].detail == (
        'message.key.columns key ("code") is not kept unique by a primary key or unique index: '
        "rows that share it become one mirror row, and a delete of any of them deletes it "
        "(cdc validate reports it as key not unique)"
    )
    assert warned[0].fix is not None
    assert warned[0].fix.startswith('CREATE UNIQUE INDEX ON "public"."bare" ("code"); (if it')
    assert report.ok, failed(report)  # a warning: the run goes on
    run(pg, database, warned[0].fix.split(";")[0])  # the statement the fix gives
    report = run_doctor(make_config(tmp_path, pg.dsn(database), tables,
                                    sections={"source": keys}))  # fmt: skip
    assert "message key public.bare" not in [c.name for c in report.checks]


def test_a_key_column_an_option_types_approximately_is_warned_of(
    pg: PgServer, database: str, tmp_path: Path
) -> None:
    """Under decimal.handling.mode: double a numeric key (here through a domain, and one
    chosen by message.key.columns) is a double in silver, under interval.handling.mode:
    numeric an interval key is microseconds: keys that round to one value become one row."""
    run(pg, database, """
        CREATE DOMAIN amount AS numeric(30, 20);
        CREATE TABLE n (id amount PRIMARY KEY, v text);
        CREATE TABLE iv (id interval PRIMARY KEY, v text);
        CREATE TABLE exact (id int PRIMARY KEY, price numeric, span interval);
        CREATE TABLE picked (code numeric NOT NULL, v text);
        ALTER TABLE picked REPLICA IDENTITY FULL;
    """)  # fmt: skip
    tables = ["public.n", "public.iv", "public.exact", "public.picked"]
    dsn = pg.dsn(database)
    keys = {"message.key.columns": "public.picked:code"}
    report = run_doctor(make_config(tmp_path, dsn, tables, sections={"source": keys}))
    assert [c.name for c in report.checks if c.name.startswith("key types")] == []

    approximate = {"decimal.handling.mode": "double", "interval.handling.mode": "numeric"}
    report = run_doctor(make_config(tmp_path, dsn, tables,
                                    sections={"source": keys, "silver": approximate}))  # fmt: skip

    warned = [c for c in report.checks if c.name.startswith("key types")]
    assert [(c.name, c.status) for c in warned] == [
        ("key types public.n", "warn"), ("key types public.iv", "warn"),
        ("key types public.picked", "warn"),
    ]  # fmt: skip
    n, iv, _ = warned
    assert n.detail == (
        'key column "id" (decimal.handling.mode: double) is typed approximately in silver: '
        "distinct keys that round to one value become one mirror row (cdc validate reports it "
        "as key not unique)"
    )
    assert n.fix.endswith("silver: decimal.handling.mode: precise (or string)")
    assert iv.fix.endswith("silver: interval.handling.mode: string")
    assert report.ok, failed(report)  # a warning: the run goes on
