"""What every doctor check reads (`Context`, gathered once after connecting) and how checks write
names and statements, quoted the way the product's own queries quote them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from psycopg import sql

from cdc_core.config import SourceConfig
from cdc_core.identifiers import TableName
from cdc_core.pg import catalog
from cdc_core.pg.catalog import Connection, RoleInfo, TableInfo

SHARED_OWNERSHIP = (
    "or share the tables' ownership with the role through a replication group "
    "(README.md, Permissions)"
)


@dataclass(frozen=True)
class Context:
    """What every check reads, gathered once after connecting."""

    conn: Connection
    source: SourceConfig
    pipeline_file: str
    role: RoleInfo
    database: catalog.DatabaseInfo
    tables: dict[TableName, TableInfo | None]
    slot: catalog.SlotInfo | None
    signal_table: TableName | None
    publication: catalog.PublicationInfo | None
    selects: Mapping[TableName, str] = field(default_factory=dict)
    """snapshot.select.statement.overrides: the SELECT a table's whole-table snapshots read."""
    approximate: Mapping[str, str] = field(default_factory=dict)
    """Base types silver types approximately, with the option that makes it so (numeric under
    decimal.handling.mode: double): distinct keys of them may become one."""

    def render(self, template: str, *parts: sql.Composable) -> str:
        """A fix statement, composed like the queries so identifiers are quoted the same way."""
        return sql.SQL(template).format(*parts).as_string(self.conn)

    @property
    def role_id(self) -> sql.Identifier:
        return sql.Identifier(self.role.name)

    @property
    def present(self) -> list[TableInfo]:
        """The configured tables that exist, in configured order."""
        return [info for info in self.tables.values() if info is not None]


def quoted(identifier: str) -> str:
    """Always double-quoted, as in the fixes, so a name reads the same in details and SQL."""
    return sql.Identifier(identifier).as_string()


def table_id(t: TableName) -> sql.Identifier:
    return sql.Identifier(t.schema, t.name)
