"""Catalog reads: tables, keys, replica identity, columns, publications, slots, roles, settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, tuple_row

from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.pg.connect import APPLICATION_NAME
from cdc_core.pg.pgoutput import Relation, ReplicaIdentity

RelKind = Literal["ordinary", "partitioned"]
_RELKINDS: dict[str, RelKind] = {"r": "ordinary", "p": "partitioned"}

# Every reader here only needs a connection that can run a query; rows come back as tuples.
Connection = psycopg.Connection[TupleRow]


FAILOVER_SLOTS = 170_000
"""The server version (`server_version_num`) from which a slot can be a failover slot."""


@dataclass(frozen=True)
class Leaf:
    """A partition that holds rows of a partitioned table: its replica identity is its own."""

    name: str
    """As `regclass` prints it: schema-qualified unless on the search path, quoted as needed."""
    replica_identity: ReplicaIdentity
    primary_key: tuple[str, ...]
    identity_index: str | None
    identity_index_columns: tuple[str, ...]

    @property
    def identity_columns(self) -> tuple[str, ...]:
        """Columns its UPDATE/DELETE events identify the row by; empty for FULL and NOTHING."""
        return identity_columns(self.replica_identity, self.primary_key,
                                self.identity_index_columns)  # fmt: skip


def identity_columns(
    identity: ReplicaIdentity, primary_key: tuple[str, ...], index_columns: tuple[str, ...]
) -> tuple[str, ...]:
    """The columns a replica identity sends the old row's values of; empty for FULL (the whole
    row) and NOTHING."""
    if identity is ReplicaIdentity.DEFAULT:
        return primary_key
    if identity is ReplicaIdentity.INDEX:
        return index_columns
    return ()


@dataclass(frozen=True)
class TableInfo:
    """One captured table as the catalog and the current role see it."""

    name: TableName
    oid: int
    kind: RelKind
    owner: str
    primary_key: tuple[str, ...]
    """Primary key columns in key order; empty without a primary key."""
    replica_identity: ReplicaIdentity
    identity_index: str | None
    """Name of the REPLICA IDENTITY USING INDEX index; None unless the identity is INDEX."""
    identity_index_columns: tuple[str, ...]
    """Columns of that index in index order; empty if it was dropped (then it acts as NOTHING)."""
    can_select: bool
    """The current role has SELECT on the table (USAGE on its schema is `schema_usage`)."""
    schema_usage: bool
    is_owner: bool
    """The current role owns the table, directly or through a role it inherits (or is superuser)."""
    columns: tuple[str, ...]
    """Its live columns in table order (what message.key.columns is matched against)."""
    row_security: bool = False
    """Row-level security filters what the current role reads of it (`row_security_active`)."""
    ancestors: tuple[int, ...] = ()
    """The OIDs of the partitioned tables it is a partition of, nearest first."""
    leaves: tuple[Leaf, ...] = ()
    """A partitioned table's partitions that hold its rows (their changes are sent as its)."""
    persistence: str = "p"
    """relpersistence: p permanent; u unlogged and t temporary, whose changes skip the WAL."""

    @property
    def identity_columns(self) -> tuple[str, ...]:
        """Columns an UPDATE/DELETE event identifies its row by; empty for FULL and NOTHING."""
        return identity_columns(self.replica_identity, self.primary_key,
                                self.identity_index_columns)  # fmt: skip


@dataclass(frozen=True)
class ColumnInfo:
    """One column of a table, in table order."""

    name: str
    position: int
    type_oid: int
    type_name: str
    """`format_type(atttypid, atttypmod)`, e.g. `numeric(12,2)` or `character varying(40)`."""
    not_null: bool


@dataclass(frozen=True)
class RoleInfo:
    """The role the connection runs as."""

    name: str
    superuser: bool
    replication: bool
    rds_replication: bool | None
    """Member of Amazon RDS's `rds_replication`; None where that role does not exist."""


@dataclass(frozen=True)
class DatabaseInfo:
    """The database the connection is in."""

    name: str
    encoding: str
    can_create: bool
    """The current role has CREATE on it (needed to create a publication)."""


@dataclass(frozen=True)
class Setting:
    """A server setting, and whether a changed value waits for a restart."""

    name: str
    value: str
    pending_restart: bool


@dataclass(frozen=True)
class PublicationInfo:
    """A publication, the tables it publishes and whether the current role owns it."""

    name: str
    owner: str
    is_owner: bool
    all_tables: bool
    operations: frozenset[str]
    """Published operations among insert, update, delete, truncate."""
    tables: frozenset[TableName]
    via_root: bool
    """publish_via_partition_root: a partitioned table's changes come under its own name, not
    under its partitions' (which a pipeline capturing the partitioned table would not know)."""

    table_rows: frozenset[tuple[TableName, int]] = frozenset()
    """(table, oid) of its `pg_publication_rel` rows (FOR TABLE)."""
    schema_rows: frozenset[tuple[str, int]] = frozenset()
    """(schema, oid) of its `pg_publication_namespace` rows (FOR TABLES IN SCHEMA, 15+)."""
    row_filters: frozenset[tuple[TableName, str]] = frozenset()
    """(table, WHERE expression) of the tables it publishes only some rows of (15+)."""
    column_lists: frozenset[tuple[TableName, tuple[str, ...]]] = frozenset()
    """(table, columns) of the tables it publishes only some columns of (15+)."""

    def row_filter(self, table: TableName) -> str | None:
        """The condition a row of `table` must meet for its changes to be sent, if any."""
        return next((where for t, where in self.row_filters if t == table), None)

    def column_list(self, table: TableName) -> tuple[str, ...] | None:
        """The only columns of `table` whose values are sent, if it names them."""
        return next((columns for t, columns in self.column_lists if t == table), None)

    def lacks(self, tables: Sequence[TableName]) -> list[TableName]:
        """The `tables` it does not publish (none when it is FOR ALL TABLES)."""
        return [] if self.all_tables else [t for t in tables if t not in self.tables]

    def membership(self, table: TableName) -> frozenset[str]:
        """The catalog rows that make `table` a member, as `table OID` and `schema OID`. Taking
        a table (or schema) out and adding it back makes a new row with a new oid, so a table
        none of whose rows survive was out in between; none for FOR ALL TABLES."""
        return frozenset(f"table {oid}" for t, oid in self.table_rows if t == table) | frozenset(
            f"schema {oid}" for s, oid in self.schema_rows if s == table.schema
        )


@dataclass(frozen=True)
class SlotInfo:
    """A replication slot as `pg_replication_slots` shows it."""

    name: str
    slot_type: str
    plugin: str | None
    database: str | None
    active_pid: int | None
    wal_status: str | None
    failover: bool | None = None  # synchronized to standbys (PostgreSQL 17+; None before)
    reader: str | None = None  # the application_name of the process reading it now

    def unusable(self, database: str) -> list[str]:
        """Why a pipeline on `database` cannot read this slot; none when it can."""
        problems = []
        if self.slot_type != "logical":
            problems.append(f"is a {self.slot_type} slot")
        elif self.plugin != "pgoutput":
            problems.append(f"uses plugin {self.plugin}, not pgoutput")
        if self.database not in (None, database):
            problems.append(f"belongs to database {sql.Identifier(self.database).as_string()}")
        return problems

    @property
    def foreign_reader(self) -> bool:
        """Read now by a process that is no run of this product (whose sessions reading a slot
        are all named `connect.APPLICATION_NAME`): a Debezium connector not stopped yet, a
        `pg_recvlogical`. A run waits for the slot to be let go, then exits 75."""
        return self.active_pid is not None and self.reader != APPLICATION_NAME


@dataclass(frozen=True)
class ReplicationUsage:
    """How many replication slots and WAL senders are taken, server-wide."""

    slots: int
    wal_senders: int


def _rows(conn: Connection, query: str, params: Sequence[object] | None = None) -> list[TupleRow]:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


_INDEX_COLUMNS = """
    ARRAY(SELECT a.attname::text
          FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
          ORDER BY k.ord)
"""

_TABLE_INFO = f"""
SELECT t.ord, c.oid, c.relkind, pg_get_userbyid(c.relowner), c.relreplident,
       (SELECT {_INDEX_COLUMNS} FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       (SELECT i.indexrelid::regclass::text FROM pg_index i
        WHERE i.indrelid = c.oid AND i.indisreplident),
       (SELECT {_INDEX_COLUMNS} FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
       has_table_privilege(c.oid, 'SELECT'), has_schema_privilege(n.oid, 'USAGE'),
       pg_has_role(c.relowner, 'USAGE'),
       ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),
       row_security_active(c.oid),
       ARRAY(SELECT a.relid::oid FROM pg_partition_ancestors(c.oid) WITH ORDINALITY AS a(relid, o)
             WHERE a.relid <> c.oid ORDER BY a.o),
       c.relpersistence::text
FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(schema_name, table_name, ord)
JOIN pg_namespace n ON n.nspname = t.schema_name
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.table_name AND c.relkind IN ('r', 'p')
"""


def table_info(conn: Connection, tables: Sequence[TableName]) -> dict[TableName, TableInfo | None]:
    """Keys, replica identity and the current role's rights for each table; None if missing.

    Views, sequences and other relations that are not tables count as missing.
    """
    rows = _rows(conn, _TABLE_INFO, ([t.schema for t in tables], [t.name for t in tables]))
    found: dict[TableName, TableInfo | None] = dict.fromkeys(tables)
    partitioned = [int(str(row[1])) for row in rows if str(row[2]) == "p"]
    leaves = _leaves(conn, partitioned) if partitioned else {}
    for (ord_, oid, relkind, owner, ident, pk, index, index_cols, select, usage, owns, cols,
         filtered, ancestors, persistence) in rows:  # fmt: skip
        name = tables[int(ord_) - 1]
        found[name] = TableInfo(
            name=name,
            oid=int(oid),
            kind=_RELKINDS[str(relkind)],
            owner=str(owner),
            primary_key=tuple(pk or ()),
            replica_identity=ReplicaIdentity(str(ident)),
            identity_index=str(index) if index is not None else None,
            identity_index_columns=tuple(index_cols or ()),
            can_select=bool(select),
            schema_usage=bool(usage),
            is_owner=bool(owns),
            columns=tuple(cols or ()),
            row_security=bool(filtered),
            ancestors=tuple(int(a) for a in ancestors or ()),
            leaves=leaves.get(int(oid), ()),
            persistence=str(persistence),
        )
    return found


_LEAVES = f"""
SELECT r.oid, c.oid::regclass::text, c.relreplident,
       (SELECT {_INDEX_COLUMNS} FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       (SELECT i.indexrelid::regclass::text FROM pg_index i
        WHERE i.indrelid = c.oid AND i.indisreplident),
       (SELECT {_INDEX_COLUMNS} FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
FROM unnest(%s::oid[]) AS r(oid), pg_partition_tree(r.oid) p
JOIN pg_class c ON c.oid = p.relid
WHERE p.isleaf AND c.relkind = 'r'
ORDER BY r.oid, p.level, c.oid
"""


def _leaves(conn: Connection, oids: Sequence[int]) -> dict[int, tuple[Leaf, ...]]:
    """The partitions holding rows of each partitioned table of `oids`, at every level."""
    found: dict[int, list[Leaf]] = {}
    for root, name, ident, pk, index, index_cols in _rows(conn, _LEAVES, (list(oids),)):
        leaf = Leaf(str(name), ReplicaIdentity(str(ident)), tuple(pk or ()),
                    str(index) if index is not None else None, tuple(index_cols or ()))  # fmt: skip
        found.setdefault(int(str(root)), []).append(leaf)
    return {oid: tuple(leaves) for oid, leaves in found.items()}


def table_columns(conn: Connection, table: TableName) -> tuple[ColumnInfo, ...]:
    """The live columns of `table` in table order; empty if the table does not exist."""
    rows = _rows(
        conn,
        """
        SELECT a.attname, a.attnum, a.atttypid, format_type(a.atttypid, a.atttypmod), a.attnotnull
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        (table.schema, table.name),
    )
    return tuple(
        ColumnInfo(str(name), int(pos), int(oid), str(type_name), bool(not_null))
        for name, pos, oid, type_name, not_null in rows
    )


def list_tables(conn: Connection) -> list[TableName]:
    """Every table in the database outside the system schemas (for "did you mean" hints)."""
    rows = _rows(
        conn,
        """
        SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
          AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname !~ '^pg_(toast|temp_)'
        ORDER BY 1, 2
        """,
    )
    return [TableName(str(schema), str(name)) for schema, name in rows]


def current_role(conn: Connection) -> RoleInfo:
    """Attributes of the current role; REPLICATION is not inherited, so it is the role's own."""
    ((name, superuser, replication, rds),) = _rows(
        conn,
        """
        SELECT r.rolname, r.rolsuper, r.rolreplication,
               (SELECT pg_has_role(r.oid, g.oid, 'MEMBER') FROM pg_roles g
                WHERE g.rolname = 'rds_replication')
        FROM pg_roles r WHERE r.rolname = current_user
        """,
    )
    return RoleInfo(
        str(name), bool(superuser), bool(replication), None if rds is None else bool(rds)
    )


def current_database(conn: Connection) -> DatabaseInfo:
    """Name, encoding and CREATE right of the connection's database."""
    ((name, encoding, can_create),) = _rows(
        conn,
        """
        SELECT datname, pg_encoding_to_char(encoding), has_database_privilege(oid, 'CREATE')
        FROM pg_database WHERE datname = current_database()
        """,
    )
    return DatabaseInfo(str(name), str(encoding), bool(can_create))


def settings(conn: Connection, names: Sequence[str]) -> dict[str, Setting]:
    """Server settings by name, from `pg_settings` (which also says what waits for a restart)."""
    rows = _rows(
        conn,
        "SELECT name, setting, pending_restart FROM pg_settings WHERE name = ANY(%s)",
        (list(names),),
    )
    return {str(n): Setting(str(n), str(v), bool(p)) for n, v, p in rows}


def publication_info(conn: Connection, name: str) -> PublicationInfo | None:
    """The publication called `name` in this database, or None."""
    # FOR TABLES IN SCHEMA, row filters and column lists came with PostgreSQL 15
    schema_rows = row_filters = column_lists = "'{}'::text[]"
    if conn.info.server_version >= 150000:
        schema_rows = """ARRAY(SELECT ARRAY[n.nspname::text, s.oid::text]
                     FROM pg_publication_namespace s JOIN pg_namespace n ON n.oid = s.pnnspid
                     WHERE s.pnpubid = p.oid)"""
        # the filter in effect: a table its schema publishes too is published whole
        row_filters = """ARRAY(SELECT ARRAY[t.schemaname::text, t.tablename::text, t.rowfilter]
                     FROM pg_publication_tables t
                     WHERE t.pubname = p.pubname AND t.rowfilter IS NOT NULL)"""
        # a column list excludes FOR TABLES IN SCHEMA from the publication: its own row has it
        column_lists = """ARRAY(SELECT ARRAY[n.nspname::text, c.relname::text, a.attname::text]
                     FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     JOIN pg_attribute a ON a.attrelid = r.prrelid
                                        AND a.attnum = ANY(r.prattrs::int2[])
                     WHERE r.prpubid = p.oid ORDER BY r.oid, a.attnum)"""
    rows = _rows(
        conn,
        """
        SELECT pg_get_userbyid(p.pubowner), pg_has_role(p.pubowner, 'USAGE'), p.puballtables,
               ARRAY_REMOVE(ARRAY[CASE WHEN p.pubinsert THEN 'insert' END,
                                  CASE WHEN p.pubupdate THEN 'update' END,
                                  CASE WHEN p.pubdelete THEN 'delete' END,
                                  CASE WHEN p.pubtruncate THEN 'truncate' END], NULL),
               ARRAY(SELECT ARRAY[t.schemaname::text, t.tablename::text]
                     FROM pg_publication_tables t WHERE t.pubname = p.pubname
                     UNION  -- a partitioned table is listed by its leaves unless via root
                     SELECT ARRAY[n.nspname::text, c.relname::text]
                     FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = p.oid),
               p.pubviaroot,
               ARRAY(SELECT ARRAY[n.nspname::text, c.relname::text, r.oid::text]
                     FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = p.oid),
               """
        + ",\n".join((schema_rows, row_filters, column_lists))
        + """
        FROM pg_publication p WHERE p.pubname = %s
        """,
        (name,),
    )
    if not rows:
        return None
    ((owner, is_owner, all_tables, operations, tables, via_root, table_rows, schemas, filters,
      columns),) = rows  # fmt: skip
    listed: dict[TableName, list[str]] = {}
    for s, t, column in columns:
        listed.setdefault(TableName(s, t), []).append(str(column))
    return PublicationInfo(
        name=name,
        owner=str(owner),
        is_owner=bool(is_owner),
        all_tables=bool(all_tables),
        operations=frozenset(operations),
        tables=frozenset(TableName(s, t) for s, t in tables),
        via_root=bool(via_root),
        table_rows=frozenset((TableName(s, t), int(oid)) for s, t, oid in table_rows),
        schema_rows=frozenset((str(s), int(oid)) for s, oid in schemas),
        row_filters=frozenset((TableName(s, t), str(where)) for s, t, where in filters),
        column_lists=frozenset((t, tuple(names)) for t, names in listed.items()),
    )


def slot_info(conn: Connection, name: str) -> SlotInfo | None:
    """The replication slot called `name` (slots are server-wide), or None."""
    failover = "failover" if conn.info.server_version >= FAILOVER_SLOTS else "NULL::bool"
    rows = _rows(
        conn,
        f"SELECT slot_type, plugin, database, active_pid, wal_status, {failover}, "
        f"({SLOT_READER}) FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    )
    if not rows:
        return None
    ((slot_type, plugin, database, active_pid, wal_status, fails_over, reader),) = rows
    return SlotInfo(
        name, str(slot_type), plugin, database, active_pid, wal_status, fails_over, reader
    )


# The application_name of the process reading a slot now (pg_replication_slots' active_pid);
# shown to every role, whoever runs that process
SLOT_READER = "SELECT application_name FROM pg_stat_activity WHERE pid = active_pid"


def replication_usage(conn: Connection) -> ReplicationUsage:
    """Slots and WAL senders in use; `pg_stat_replication` lists every walsender to any role."""
    ((slots, senders),) = _rows(
        conn,
        "SELECT (SELECT count(*) FROM pg_replication_slots), "
        "(SELECT count(*) FROM pg_stat_replication)",
    )
    return ReplicationUsage(int(slots), int(senders))


def _type_rows(conn: Connection, oids: set[int]) -> dict[int, tuple[str, str, int, int, int, bool]]:
    """(name, typtype, base type, its typmod, element, is an array) of each type. An array is
    its element's array type: int2vector and oidvector also have an element and the array
    category, but print their values apart by spaces, not as arrays."""
    rows = _rows(
        conn,
        "SELECT t.oid::int, t.typname::text, t.typtype::text, t.typbasetype::int, t.typtypmod, "
        "t.typelem::int, coalesce(e.typarray = t.oid, false) "
        "FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem WHERE t.oid = ANY(%s)",
        (list(oids),),
    )
    return {
        int(r[0]): (str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]), bool(r[6])) for r in rows
    }


def resolve_types(
    conn: Connection, columns: Sequence[tuple[int, int]]
) -> list[tuple[str, str, int, bool]]:
    """(typname, typtype, typmod, is array) of each (type oid, typmod) behind domains and arrays.

    A domain's own typmod (say numeric(10,2)) applies when the column has none; for an array
    the element's type is resolved the same way. A type the catalog no longer has reads as text.
    """
    known: dict[int, tuple[str, str, int, int, int, bool]] = {}
    out = []
    for column_oid, column_modifier in columns:
        oid, modifier, is_array = column_oid, column_modifier, False
        for _ in range(32):  # domains over domains over arrays: a bounded walk
            if oid not in known:
                known.update(_type_rows(conn, {oid}))
            row = known.get(oid)
            if row is None:
                out.append(("text", "b", -1, is_array))
                break
            name, kind, base, base_mod, element, array = row
            if kind == "d":
                oid, modifier = base, modifier if modifier != -1 else base_mod
            elif array and not is_array:
                oid, is_array = element, True
            else:
                out.append((name, kind, modifier, is_array))
                break
    return out


def describe_relation(
    conn: Connection, relation: Relation, type_names: dict[int, str]
) -> RelationDescriptor:
    """A Relation message with the catalog's primary key and types added.

    The catalog is read now, not as of the WAL position: after a key change, the current key is
    used (as Debezium does). A type the catalog no longer has keeps the name pgoutput sent.
    """
    ((primary_key,),) = _rows(
        conn,
        """
        SELECT coalesce(array_agg(a.attname::text ORDER BY array_position(i.indkey, a.attnum)),
                        '{}')
        FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s AND i.indisprimary
        """,
        (relation.oid,),
    )
    oids = [c.type_oid for c in relation.columns]
    mods = [c.type_modifier for c in relation.columns]
    rows = _rows(
        conn,
        "SELECT format_type(o, nullif(m, -1)) FROM unnest(%s::oid[], %s::int[]) "
        "WITH ORDINALITY AS x(o, m, i) ORDER BY i",
        (oids, mods),
    )
    names = [str(n) if n is not None and not str(n).startswith("???") else "" for (n,) in rows]
    resolved = resolve_types(conn, list(zip(oids, mods, strict=True)))
    columns = tuple(
        ColumnDescriptor(
            c.name, c.type_oid, c.type_modifier,
            names[i] or type_names.get(c.type_oid, str(c.type_oid)), c.is_key,
            *resolved[i],
        )
        for i, c in enumerate(relation.columns)
    )  # fmt: skip
    return RelationDescriptor(
        oid=relation.oid,
        version=0,
        schema=relation.namespace or "pg_catalog",
        table=relation.name,
        replica_identity=relation.replica_identity,
        columns=columns,
        primary_key=tuple(str(c) for c in primary_key),
    )


def relation_exists(conn: Connection, oid: int) -> bool:
    """Whether `oid` is a relation's in the catalog now (a dropped table's is no one's)."""
    return bool(_rows(conn, "SELECT 1 FROM pg_class WHERE oid = %s::oid", (oid,)))


def own_rows(conn: psycopg.Connection[Any], table: TableName) -> sql.Composed:
    """What a query reads `table`'s rows from: `ONLY t` for a table, whose inheritance
    children's rows are theirs (the stream sends their changes as the child's, and a table
    left out of the pipeline is not mirrored through its parent); `t` for a partitioned table,
    whose rows are its partitions' (the stream sends them as the root's)."""
    name = sql.Identifier(table.schema, table.name)
    row = conn.execute(
        sql.SQL("SELECT relkind::text FROM pg_class WHERE oid = to_regclass({})").format(
            sql.Literal(name.as_string(conn))
        )
    ).fetchone()
    return sql.SQL("{}{}").format(sql.SQL("" if row and row[0] == "p" else "ONLY "), name)
