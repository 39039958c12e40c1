"""What a pipeline file (`pipelines/NAME.yaml`) and an environment file (`conf/ENV.yaml`) hold."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc_core.columns import ColumnRules, Rule
from cdc_core.config.loader import ENV_VALUE, FieldError, meta, suggest
from cdc_core.config.validate import ValidateConfig
from cdc_core.errors import first_line
from cdc_core.identifiers import MAX_IDENTIFIER_BYTES, TableName
from cdc_core.name_patterns import (
    checked_pattern,
    joined_patterns,
    matches,
    matches_any,
    split_patterns,
)
from cdc_core.pgtypes.scalars import MAX_MONEY_DIGITS
from cdc_core.unavailable import placeholder_octets

SnapshotMode = Literal["initial", "always", "initial_only", "no_data", "when_needed"]
JarsMode = Literal["resolve", "provided"]
ReaderMode = Literal["stream", "sql"]
AutocreateMode = Literal["filtered", "all_tables", "disabled"]
FailureMode = Literal["fail", "warn", "skip"]
TablesOrder = Literal["disabled", "ascending", "descending"]
LimitAction = Literal["warn", "fail"]
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}  # fmt: skip

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
# libpq ends a URI's user info at the first `@` before any `/` (a `?` or `#` is part of it)
_URI_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^@/:]*:([^@/]*)@")
SAFE_VACUUM_HOURS = 168  # Delta's delta.deletedFileRetentionDuration default
_PG_INT_MAX = 2**31 - 1  # PostgreSQL's integer settings (statement_timeout), JDBC's fetch size


@dataclass(frozen=True)
class Dsn:
    """A libpq connection string; prints without its password."""

    conninfo: str = field(repr=False)
    query_timeout_s: float = 0.0
    """`source.query_timeout_s` (0: no limit), which `connect` sets as `statement_timeout` on the
    product's sessions from this string; the pipeline's loader puts it here."""
    initial_statements: tuple[str, ...] = ()
    """`source.database.initial.statements`, which `connect` runs on every session that does not
    read the slot, and snapshot reads on every JDBC session; the loader puts them here."""

    @classmethod
    def parse(cls, text: str) -> Dsn:
        text = text.strip()
        if not text:
            raise ValueError(
                "the connection string is empty (for example postgresql://user@127.0.0.1:5432/shop)"
            )
        problem = _conninfo_problem(text)
        if problem:
            raise ValueError(f"not a connection string libpq takes: {problem}")
        return cls(text)

    @property
    def redacted(self) -> str:
        """The connection string with any password replaced by `***`."""
        if "://" in self.conninfo:
            scheme, _, rest = self.conninfo.partition("://")
            end = next((i for i, c in enumerate(rest) if c in "@/"), len(rest))
            head = f"{scheme}://"
            if rest[end : end + 1] == "@":  # user info as libpq reads it (`_URI_PASSWORD`)
                user, colon, _ = rest[:end].partition(":")
                head += f"{user}{':***' if colon else ''}@"
                rest = rest[end + 1 :]
            base, mark, query = rest.partition("?")
            query = _PASSWORD_KV.sub(r"\1***", query.replace("&", " ")).replace(" ", "&")
            return f"{head}{base}{mark}{query}"
        return _PASSWORD_KV.sub(r"\1***", self.conninfo)

    @property
    def has_password(self) -> bool:
        return _password(self.conninfo) is not None

    def with_password(self, password: str) -> Dsn:
        """The same connection string with `password` added (quoted as libpq reads it)."""
        if "://" in self.conninfo:
            sep = "&" if "?" in self.conninfo else "?"
            added = f"{self.conninfo}{sep}password={quote(password, safe='')}"
        else:
            escaped = password.replace("\\", "\\\\").replace("'", "\\'")
            added = f"{self.conninfo} password='{escaped}'"
        return dataclasses.replace(self, conninfo=added)

    @staticmethod
    def check_written(written: str) -> str | None:
        """Why the value as the file writes it (`ENV_VALUE` where the environment fills it in)
        is refused: a password in clear. None when it is not."""
        password = _password(written)
        if password is None or ENV_VALUE in password:
            return None
        return (
            "the connection string holds a password written in the file (a default included): "
            "take it from the environment, e.g. postgresql://user:${PG_PASSWORD}@host/db or the "
            "whole DSN as ${ORDERS_PG_DSN}, or from a secrets file with source.password_file"
        )

    @staticmethod
    def substituted(template: str, start: int, end: int, value: str) -> str:
        """`value`, from the environment for the `${VAR}` at `template[start:end]` (the other
        variables masked), as the connection string must hold it to mean that text: percent-
        encoded in a URI (a password holding `/`, `@`, `%` or a space broke it, or was read in
        part as the host), quoted as a key=value value. As it is where the variable is the whole
        string (the whole DSN), in a URI's host list (`host:port`, several hosts), or in its
        query anywhere but after a `=` (`?${PG_PARAMS}` as `sslmode=require&connect_timeout=5`)."""
        if start == 0 and end == len(template):
            return value
        uri = _URI_PREFIX.match(template)
        if uri is not None:
            rest = template[uri.end() :]
            authority = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
            hosts = range(uri.end() + rest.rfind("@", 0, authority) + 1, uri.end() + authority)
            query = template.find("?", uri.end())
            in_query = 0 <= query < start and not template[:start].endswith("=")
            return value if start in hosts or in_query else quote(value, safe="")
        before, after = template[:start].rstrip(), template[end:]
        if before.endswith("=") and not after[:1].strip() and not _PLAIN_KV_VALUE.fullmatch(value):
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return value

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"Dsn({self.redacted!r})"


_URI_PREFIX = re.compile(r"\s*postgres(?:ql)?://")
_PLAIN_KV_VALUE = re.compile(r"[^\s'\\]+")  # a key=value value that needs no quotes


_CHOICES = {  # libpq's settings with a fixed set of values, which it checks only as it connects
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
}


def _conninfo_problem(conninfo: str) -> str | None:
    """What libpq would refuse in `conninfo`, told at load rather than by a connection that
    fails every time (a run exits 75, "retry", for a value no retry fixes); None when nothing.
    The syntax is libpq's own parser's verdict; ports and the settings of `_CHOICES` are checked
    as libpq checks them when it connects."""
    try:
        settings = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as e:
        said = first_line(e) if str(e).strip() else ""
        if not said or "password" in conninfo.lower() or _URI_PASSWORD.match(conninfo):
            said = "libpq cannot parse it"  # its message may quote a piece of the password
        return f"{said} (write key=value pairs, or a postgresql:// URI)"
    for port in str(settings.get("port") or "").split(","):
        if port.strip() and not (port.strip().isdigit() and 1 <= int(port) <= 65535):
            return f"port {port.strip()!r} is not a TCP port (1 to 65535)"
    for key, allowed in _CHOICES.items():
        value = settings.get(key)
        if value is not None and str(value) not in allowed:
            return f"{key} {value!r} is not one of {', '.join(allowed)}"
    return None


def _password(conninfo: str) -> str | None:
    """The password a connection string holds (in a URI's user info or query, or as
    `password=`), or None."""
    if "://" in conninfo:
        found = _URI_PASSWORD.match(conninfo.strip())
        if found and found.group(1):
            return found.group(1)
        query = conninfo.partition("?")[2].replace("&", " ")
        kv = _PASSWORD_KV.search(query)
    else:
        kv = _PASSWORD_KV.search(conninfo)
    value = kv.group(2).strip("'") if kv else ""
    return value or None


class ByteSize(int):
    """A size in bytes, written as 67108864, 64MiB or 64MB."""

    @classmethod
    def parse(cls, text: str) -> ByteSize:
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _BYTE_UNITS:
            raise ValueError(f"{text!r} is not a size (write bytes, or e.g. 64MiB, 512KB, 1GiB)")
        return cls(int(m.group(1)) * _BYTE_UNITS[unit])

    def readable(self) -> str:
        """`512 B`, `1.5 KiB`, `3.2 GiB`: one decimal in the largest binary unit below it."""
        size, unit = float(self), "B"
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if size < 1024 or unit == "TiB":
                break
            size /= 1024
        return f"{int(self)} B" if unit == "B" else f"{size:.1f} {unit}"


@dataclass(frozen=True)
class Statements:
    """Debezium's `database.initial.statements`: SQL statements separated by `;`, where `;;` is
    a semicolon inside one (`parse`), or a YAML list of whole statements (`from_items`)."""

    items: tuple[str, ...] = ()
    type_name = "SQL statements: a list, or separated by ; (;; for a semicolon in one)"

    @classmethod
    def parse(cls, text: str) -> Statements:
        """Split as Debezium's `JdbcConnection.parseSqlStatementString` does: a `;` ends a
        statement unless another follows it; blank statements are dropped."""
        statements, current, i = [], "", 0
        while i < len(text):
            if text[i] == ";" and text[i + 1 : i + 2] == ";":
                current, i = current + ";", i + 2
                continue
            if text[i] == ";":
                statements.append(current)
                current = ""
            else:
                current += text[i]
            i += 1
        return cls.from_items([*statements, current])

    @classmethod
    def from_items(cls, items: list[str]) -> Statements:
        return cls(tuple(s.strip() for s in items if s.strip()))

    def __bool__(self) -> bool:
        return bool(self.items)

    def __str__(self) -> str:
        return "; ".join(s.replace(";", ";;") for s in self.items)


@dataclass(frozen=True)
class RegexList:
    """Comma-separated regular expressions, each matched against a whole name (anchored),
    ignoring case, as Debezium matches its lists; `\\,` is a comma inside an expression."""

    patterns: tuple[str, ...] = ()
    type_name = "regexes, anchored, case-insensitive: a list or comma-separated (\\, for a comma)"

    @classmethod
    def parse(cls, text: str) -> RegexList:
        return cls.from_items(split_patterns(text))

    @classmethod
    def from_items(cls, items: list[str]) -> RegexList:
        """From a YAML list: one expression per item, commas inside kept."""
        return cls(tuple(checked_pattern(p.strip()) for p in items if p.strip()))

    def matches(self, name: str) -> bool:
        return matches_any(self.patterns, name)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __str__(self) -> str:
        return joined_patterns(self.patterns)


SignalChannel = Literal["source", "file"]
_SIGNAL_CHANNELS: tuple[SignalChannel, ...] = ("source", "file")
_NOT_CHANNELS = {
    "kafka": "it reads a Kafka topic, and this product runs without Kafka",
    "jmx": "it takes signals through a JMX MBean of a long-running Kafka Connect JVM, and a run "
    "here is a Python driver that starts, catches up and ends",
}


@dataclass(frozen=True)
class SignalChannels:
    """Debezium's `signal.enabled.channels`: where signals are read from."""

    names: tuple[SignalChannel, ...] = ("source",)
    type_name = "source, file: comma-separated or a list"

    @classmethod
    def parse(cls, text: str) -> SignalChannels:
        return cls.from_items(text.split(","))

    @classmethod
    def from_items(cls, items: list[str]) -> SignalChannels:
        names: list[SignalChannel] = []
        for item in (i.strip() for i in items):
            channel = next((c for c in _SIGNAL_CHANNELS if c == item.lower()), None)
            if item.lower() in _NOT_CHANNELS:
                raise ValueError(
                    f"the {item.lower()} channel is not supported: "
                    f"{_NOT_CHANNELS[item.lower()]}; use source (the table of "
                    "signal.data.collection) or file (signal.file)"
                )
            if channel is None and item:
                raise ValueError(
                    f"{item!r} is not a signal channel: one of {', '.join(_SIGNAL_CHANNELS)}"
                    f"{suggest(item.lower(), _SIGNAL_CHANNELS)}"
                )
            if channel is not None and channel not in names:
                names.append(channel)
        if not names:
            raise ValueError(f"name a channel: {', '.join(_SIGNAL_CHANNELS)} or both")
        return cls(tuple(names))

    def __contains__(self, channel: str) -> bool:
        return channel in self.names

    def __str__(self) -> str:
        return ",".join(self.names)


@dataclass(frozen=True)
class Operations:
    """A set of Debezium operation codes (c, u, d, t), or none."""

    codes: frozenset[str] = frozenset()
    type_name = "c,u,d,t or none"

    @classmethod
    def parse(cls, text: str) -> Operations:
        codes = [c.strip().lower() for c in text.split(",") if c.strip()]  # as Debezium: any case
        if codes == ["none"]:
            return cls()
        wrong = [c for c in codes if c not in ("c", "u", "d", "t")]
        if wrong or not codes:
            raise ValueError(
                f"{text!r} is not a list of operations: write some of c, u, d, t "
                "(comma-separated), or none"
            )
        return cls(frozenset(codes))

    def __str__(self) -> str:
        return ",".join(sorted(self.codes)) or "none"


NotificationChannel = Literal["log", "sink"]
_CHANNELS: tuple[NotificationChannel, ...] = ("log", "sink")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


@dataclass(frozen=True)
class Channels:
    """Notification channels: log, sink, or none."""

    names: frozenset[NotificationChannel] = frozenset()
    type_name = "log,sink or none"

    @classmethod
    def parse(cls, text: str) -> Channels:
        return cls.from_items(text.split(","))

    @classmethod
    def from_items(cls, items: Sequence[str]) -> Channels:
        names = [n.strip().lower() for n in items if n.strip()]  # a choice, taken in any case
        if names == ["none"]:
            return cls()
        chosen: set[NotificationChannel] = set()
        for name in names:
            if name == "jmx":
                raise ValueError(
                    "jmx is not available: no JVM connector runs to expose MBeans; use log "
                    "(a log line per notification) or sink (a record in the lake)"
                )
            if name not in _CHANNELS:
                raise ValueError(
                    f"{name!r} is not a notification channel: write some of log, sink "
                    f"(comma-separated), or none{suggest(name, _CHANNELS)}"
                )
            chosen.add("log" if name == "log" else "sink")
        return cls(frozenset(chosen))

    def __str__(self) -> str:
        return ",".join(sorted(self.names)) or "none"


@dataclass(frozen=True)
class KeyColumns:
    """Debezium's `message.key.columns`: `<table regex>:<col>,<col>;<table regex>:<col>`.

    Resolved as Debezium's `Key.CustomKeyMapper` resolves it (3.x): every `<table regex>:<col>`
    pair of every entry becomes the regular expression `<table regex>.<col>`, matched (anchored,
    ignoring case) against each column's `schema.table.column`. The key is, pair by pair in the
    order written, the columns each pair matches, in table order: the union of every entry that
    matches the table, not the first. A named column the table lacks adds nothing; when no pair
    matches any column the primary key stays the key.
    """

    entries: tuple[tuple[str, tuple[str, ...]], ...] = ()
    type_name = "regex:col,col;regex:col"

    @classmethod
    def parse(cls, text: str) -> KeyColumns:
        entries = []
        for part in (p.strip() for p in text.split(";")):
            if not part:
                continue
            table, sep, cols = part.rpartition(":")
            columns = tuple(c.strip() for c in cols.split(",") if c.strip())
            if not sep or not table.strip() or not columns:
                raise ValueError(
                    f"{part!r} is not <schema.table regex>:<column>,<column> "
                    "(for example public.orders:id,line; use ; between tables)"
                )
            for column in columns:
                checked_pattern(f"{table.strip()}.{column}")
            entries.append((checked_pattern(table.strip()), columns))
        return cls(tuple(entries))

    def for_table(self, table: TableName, columns: Sequence[str]) -> tuple[str, ...] | None:
        """The key of `table`, whose columns are `columns` in table order; None when no pair
        matches one of them (the primary key stays the key). A column two pairs match is
        listed once, where the first put it."""
        key: dict[str, None] = {}
        for regex in self._pairs():
            key.update(dict.fromkeys(c for c in columns if matches(regex, _column_id(table, c))))
        return tuple(key) or None

    def unmatched(self, table: TableName, columns: Sequence[str]) -> list[str]:
        """The `<col>` items of entries that match `table` which match none of its columns
        (Debezium ignores them without a word)."""
        qualified = f"{table.schema}.{table.name}"
        return [
            name
            for pattern, names in self.entries
            if matches(pattern, qualified)
            for name in names
            if not any(matches(f"{pattern}.{name}", _column_id(table, c)) for c in columns)
        ]

    def _pairs(self) -> list[str]:
        return [f"{pattern}.{name}" for pattern, names in self.entries for name in names]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __str__(self) -> str:
        return ";".join(f"{t}:{','.join(c)}" for t, c in self.entries)


NO_KEYS = KeyColumns()


def _column_id(table: TableName, column: str) -> str:
    return f"{table.schema}.{table.name}.{column}"


@dataclass(frozen=True)
class IdentityRules:
    """Debezium's `replica.identity.autoset.values`: `<table regex>:<FULL|DEFAULT|NOTHING|INDEX
    name>,...`."""

    entries: tuple[tuple[str, str], ...] = ()
    type_name = "regex:FULL|DEFAULT|NOTHING|INDEX name,..."

    @classmethod
    def parse(cls, text: str) -> IdentityRules:
        entries = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            table, sep, value = part.rpartition(":")
            value = " ".join(value.split())
            upper = value.upper()
            ok = upper in ("FULL", "DEFAULT", "NOTHING") or (
                upper.startswith("INDEX ") and len(value.split()) == 2
            )
            if not sep or not table.strip() or not ok:
                raise ValueError(
                    f"{part!r} is not <schema.table regex>:<FULL, DEFAULT, NOTHING or INDEX "
                    "index_name> (for example public.*:FULL,public.orders:INDEX orders_uk)"
                )
            kind = upper.split()[0]
            entries.append(
                (checked_pattern(table.strip()), kind + value[5:] if kind == "INDEX" else kind)
            )
        return cls(tuple(entries))

    def for_table(self, table: TableName) -> str | None:
        """The replica identity to set on `table` (first matching entry), or None."""
        qualified = f"{table.schema}.{table.name}"
        return next((v for p, v in self.entries if matches(p, qualified)), None)

    def __bool__(self) -> bool:
        return bool(self.entries)


@dataclass(frozen=True)
class DroppedTable:
    """A captured table dropped at the source (`cdc_core.dropped`): the OID the lake recorded
    for it, and a WAL position every change of it comes before."""

    table: TableName
    oid: int
    before: int  # an LSN read after the table was found gone: the DROP committed before it
    applied: bool = False  # silver holds every change of it: nothing more is followed

    def to_json(self) -> dict[str, object]:
        return {"oid": self.oid, "before": self.before, "applied": self.applied}

    @classmethod
    def from_json(cls, table: TableName, data: Mapping[str, object]) -> DroppedTable:
        return cls(table, int(str(data["oid"])), int(str(data["before"])), bool(data["applied"]))


@dataclass(frozen=True)
class SourceConfig:
    """The PostgreSQL side: where to connect and what to capture."""

    dsn: Dsn = field(
        metadata=meta(
            "libpq connection string of the source database (URI or key=value); a password "
            "comes from the environment (${VAR}) or source.password_file, never written here",
            debezium="database.hostname, database.port, database.user, database.password, "
            "database.dbname",
            example="${ORDERS_PG_DSN:-postgresql://postgres@127.0.0.1:5432/shop}",
        )
    )
    slot: str = field(
        metadata=meta(
            "logical replication slot (pgoutput), created if missing; one slot per pipeline",
            debezium="slot.name",
            example="orders_cdc",
        )
    )
    publication: str = field(
        metadata=meta(
            "publication the slot reads through, created if missing",
            debezium="publication.name",
            example="orders_cdc",
        )
    )
    tables: tuple[TableName, ...] = field(
        default=(),
        metadata=meta(
            "tables to capture as schema.table; quote names with capitals, spaces or dots: "
            'public."Order Items". The include and exclude lists below narrow this list. '
            "Omitted (Debezium's way), the tables are those the lists let through, found in the "
            "source's catalog at the start of every run: ordinary and partitioned tables (a "
            "partitioned table as one, never its partitions) of every schema but pg_catalog, "
            "information_schema, pg_toast* and pg_temp*, less the signal table and the table "
            "heartbeat.action.query writes; schema.include.list or table.include.list is then "
            "required",
            example="[public.customers, public.orders]",
        ),
    )
    password_file: str | None = field(
        default=None,
        metadata=meta(
            "a file holding the password of the DSN's user and nothing else (a trailing newline "
            "is ignored), e.g. a mounted Kubernetes or Docker secret; read when the pipeline "
            "loads, never printed",
            debezium="database.password",
            example="/run/secrets/cdc_pg_password",
        ),
    )

    slot_failover: bool = field(
        default=False,
        metadata=meta("create the slot as a failover slot, which PostgreSQL 17+ synchronizes "
                      "to physical standbys (sync_replication_slots on the standby, "
                      "synchronized_standby_slots on the primary), so a promoted standby still "
                      "has the pipeline's position; an existing slot is made one at the next "
                      "run's start. Before PostgreSQL 17 a warning, and an ordinary slot",
                      key="slot.failover", debezium="slot.failover"),
    )  # fmt: skip
    reader: ReaderMode = field(
        default="stream",
        metadata=meta(
            "stream: the streaming replication protocol (lowest latency); sql: bounded "
            "pg_logical_slot_peek_binary_changes calls, then pg_replication_slot_advance"
        ),
    )
    publication_autocreate_mode: AutocreateMode = field(
        default="filtered",
        metadata=meta(
            "filtered: create the publication for the configured tables, or add missing ones; "
            "all_tables: create it FOR ALL TABLES (superuser); disabled: it must exist",
            key="publication.autocreate.mode",
            debezium="publication.autocreate.mode",
        ),
    )

    schema_include_list: RegexList = field(
        default=RegexList(),
        metadata=meta("capture only the listed tables in schemas matching these",
                      key="schema.include.list", debezium="schema.include.list"),
    )  # fmt: skip
    schema_exclude_list: RegexList = field(
        default=RegexList(),
        metadata=meta("leave out the listed tables in schemas matching these",
                      key="schema.exclude.list", debezium="schema.exclude.list"),
    )  # fmt: skip
    table_include_list: RegexList = field(
        default=RegexList(),
        metadata=meta("capture only the listed tables whose schema.table matches these",
                      key="table.include.list", debezium="table.include.list"),
    )  # fmt: skip
    table_exclude_list: RegexList = field(
        default=RegexList(),
        metadata=meta("leave out the listed tables whose schema.table matches these",
                      key="table.exclude.list", debezium="table.exclude.list"),
    )  # fmt: skip
    guardrail_collections_max: int = field(
        default=0,
        metadata=meta("the most tables the pipeline may capture (0: no limit), checked at the "
                      "start of every run and whenever tables found in the catalog change: a "
                      "guard against include lists that let through far more than meant",
                      key="guardrail.collections.max", debezium="guardrail.collections.max"),
    )  # fmt: skip
    guardrail_collections_limit_action: LimitAction = field(
        default="warn",
        metadata=meta("past guardrail.collections.max: warn (a warning at every run's start "
                      "and in cdc doctor) or fail (the run stops before it reads anything, "
                      "exit 1)", key="guardrail.collections.limit.action",
                      debezium="guardrail.collections.limit.action"),
    )  # fmt: skip
    message_prefix_include_list: RegexList = field(
        default=RegexList(),
        metadata=meta("keep only logical decoding messages (op=m) whose prefix matches these",
                      key="message.prefix.include.list", debezium="message.prefix.include.list"),
    )  # fmt: skip
    message_prefix_exclude_list: RegexList = field(
        default=RegexList(),
        metadata=meta("drop logical decoding messages whose prefix matches these",
                      key="message.prefix.exclude.list", debezium="message.prefix.exclude.list"),
    )  # fmt: skip
    column_include_list: RegexList = field(
        default=RegexList(),
        metadata=meta("keep only columns whose schema.table.column matches these (key "
                      "columns, and those of a DEFAULT or INDEX replica identity, always stay); "
                      "applied before staging",
                      key="column.include.list", debezium="column.include.list"),
    )  # fmt: skip
    column_exclude_list: RegexList = field(
        default=RegexList(),
        metadata=meta("drop columns whose schema.table.column matches these (never key "
                      "columns, nor those of a DEFAULT or INDEX replica identity); they are "
                      "never staged",
                      key="column.exclude.list", debezium="column.exclude.list"),
    )  # fmt: skip
    column_transforms: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=meta("Debezium's value transforms, each a key written as in Debezium with "
                      "the schema.table.column expressions it applies to (comma-separated, "
                      "anchored, case-insensitive): column.truncate.to.<n>.chars (n at least "
                      "1), column.mask.with.<n>.chars, "
                      "column.mask.hash.<algorithm>.with.salt.<salt> (hash v1) and "
                      "column.mask.hash.v2.<algorithm>.with.salt.<salt>; character columns "
                      "only, applied before staging", key="column.transforms",
                      debezium="column.truncate.to.<n>.chars, column.mask.with.<n>.chars, "
                      "column.mask.hash.<algorithm>.with.salt.<salt>"),
    )  # fmt: skip
    message_key_columns: KeyColumns = field(
        default=NO_KEYS,
        metadata=meta("the key of tables whose schema.table matches (anchored, "
                      "case-insensitive): replaces the primary key, or gives a table without "
                      "one a key (silver then MERGEs on it). Every entry that matches adds its "
                      "columns, in the order written; a column the table lacks is ignored, and "
                      "with none found the primary key stays. Its columns must be in the "
                      "replica identity (REPLICA IDENTITY FULL for columns outside the "
                      "primary key), or deletes could not find their row",
                      key="message.key.columns", debezium="message.key.columns",
                      example="public.events:event_id;public\\.audit_.*:id,at"),
    )  # fmt: skip
    replica_identity_autoset_values: IdentityRules = field(
        default=IdentityRules(),
        metadata=meta("REPLICA IDENTITY set at the start of every run on the tables whose "
                      "schema.table matches (anchored, case-insensitive; when the role may: "
                      "it must own them), e.g. public.*:FULL,public.orders:INDEX orders_uk",
                      key="replica.identity.autoset.values",
                      debezium="replica.identity.autoset.values"),
    )  # fmt: skip
    heartbeat_interval_ms: int = field(
        default=0,
        metadata=meta("send a heartbeat (a transactional logical decoding message, prefix "
                      "cdc-lake.heartbeat, recorded in bronze as op=m) when a run starts and "
                      "the last one is at least this old, so the slot moves on a quiet "
                      "database; 0: never", key="heartbeat.interval.ms",
                      debezium="heartbeat.interval.ms"),
    )  # fmt: skip
    query_timeout_s: float = field(
        default=600.0,
        metadata=meta("seconds a query of the product's on the source may run before the server "
                      "cancels it (statement_timeout; the JDBC queryTimeout of snapshot chunk "
                      "reads, rounded up to whole seconds); a cancelled query fails the run as "
                      "transient (exit 75) naming this key. Not applied to reading the slot "
                      "(the replication stream, source.reader sql's peeks and advances), "
                      "creating the slot, planning a snapshot's chunks or cdc validate; 0: no "
                      "limit", debezium="database.query.timeout.ms"),
    )  # fmt: skip
    database_initial_statements: Statements = field(
        default=Statements(),
        metadata=meta("SQL run at the start of every session the product opens on the source "
                      "to query it (catalog reads, snapshot coordinators and their JDBC chunk "
                      "reads, signals, cdc commands), never on one that reads the slot (the "
                      "replication stream, source.reader sql's peeks and advances), as in "
                      "Debezium: for session settings (SET ROLE, search_path, work_mem), not "
                      "for writes. The product's own settings are made again after them (value "
                      "formats, statement_timeout from query_timeout_s, idle timeouts). A "
                      "statement that fails stops the run (exit 1), naming it",
                      key="database.initial.statements", debezium="database.initial.statements",
                      example="SET work_mem = '64MB'; SET application_name = 'cdc;;lake'"),
    )  # fmt: skip
    retained_wal_warn: ByteSize = field(
        default=ByteSize(1 << 30),
        metadata=meta("WAL the server keeps for the slot (current WAL position less the "
                      "slot's restart_lsn) above which every batch logs a warning and `cdc "
                      "status` shows one; `cdc doctor` (and each run's start) warns of other "
                      "slots no process reads now that keep more; 0: never"),
    )  # fmt: skip
    retained_wal_fail: ByteSize = field(
        default=ByteSize(0),
        metadata=meta("above this the pipeline is unhealthy: `cdc status` reports a problem "
                      "(exit 1) and every batch logs an error naming the way out; ingest goes "
                      "on consuming, the only thing that frees the WAL. Set it below the free "
                      "disk of the source's pg_wal; 0: off",
                      example="20GiB"),
    )  # fmt: skip
    heartbeat_action_query: str | None = field(
        default=None,
        metadata=meta("SQL run on the source with each heartbeat, e.g. an INSERT into a "
                      "heartbeat table", key="heartbeat.action.query",
                      debezium="heartbeat.action.query",
                      example="INSERT INTO cdc_heartbeat (ts) VALUES (now())"),
    )  # fmt: skip
    skipped_operations: Operations = field(
        default=Operations(),
        metadata=meta("events never in bronze, each by its own op (a primary-key change "
                      "is a d and a c): c (insert), u (update), d (delete), t (truncate), or "
                      "none. Unlike Debezium (which skips t by default) "
                      "nothing is skipped by default: a mirror that ignores TRUNCATE is not one",
                      key="skipped.operations", debezium="skipped.operations"),
    )  # fmt: skip
    skip_messages_without_change: bool = field(
        default=False,
        metadata=meta("leave out of bronze an UPDATE whose kept columns (after "
                      "column.include.list / column.exclude.list and the column transforms) "
                      "hold the same values before and after it: an update of excluded columns "
                      "only, or one that set a column to its value. Only tables with REPLICA "
                      "IDENTITY FULL send the old row it takes to tell", key="skip.messages."
                      "without.change", debezium="skip.messages.without.change"),
    )  # fmt: skip
    provide_transaction_metadata: bool = field(
        default=False,
        metadata=meta("fill each change's transaction block (id <txId>:<commit LSN>, "
                      "total_order, data_collection_order) and record a BEGIN and an END event "
                      "per transaction (event_count, data_collections) in the Delta table "
                      "<root>/transactions", key="provide.transaction.metadata",
                      debezium="provide.transaction.metadata"),
    )  # fmt: skip
    unavailable_value_placeholder: str = field(
        default="__debezium_unavailable_value",
        metadata=meta("what bronze's `after` holds for an unchanged TOASTed value the server "
                      "did not send (the envelope's `unchanged` names those columns; silver "
                      "keeps the stored value): text, or hex: and hexadecimally encoded octets; "
                      "as Debezium, a bytea column gets the octets (\\x<hex>: the setting's "
                      "UTF-8, or the octets after hex:), other columns their text, and arrays, "
                      "hstore a value of their type", key="unavailable.value.placeholder",
                      debezium="unavailable.value.placeholder", example="hex:deadbeef"),
    )  # fmt: skip

    notification_enabled_channels: Channels = field(
        default=Channels(),
        metadata=meta("where snapshot notifications go (Debezium's format: STARTED, "
                      "IN_PROGRESS per chunk window, TABLE_SCAN_COMPLETED, COMPLETED, ABORTED): "
                      "log (a log line each), sink (appended to "
                      "<root>/_state/<notification.sink.topic.name>.jsonl, and a Delta table "
                      "beside it, <topic>.delta), or none. jmx is not available",
                      key="notification.enabled.channels",
                      debezium="notification.enabled.channels", example="log,sink"),
    )  # fmt: skip
    notification_sink_topic_name: str | None = field(
        default=None,
        metadata=meta("name of the sink channel's record under <root>/_state (a Kafka topic "
                      "name: letters, digits, . _ -); required when the sink channel is on",
                      key="notification.sink.topic.name",
                      debezium="notification.sink.topic.name", example="notifications"),
    )  # fmt: skip
    discovered: bool = field(default=False, init=False, repr=False, compare=False)
    """The tables are found in the source's catalog (`source.tables` omitted), not listed."""
    dropped: tuple[DroppedTable, ...] = field(default=(), init=False, repr=False, compare=False)
    """Captured tables dropped at the source, no longer in `tables` (`cdc_core.dropped`)."""

    def __post_init__(self) -> None:
        self._add_password()
        self._check_placeholder()
        for key, value in self.column_transforms.items():
            try:
                Rule.parse(key, value)
            except ValueError as e:
                raise FieldError(f"column.transforms.{key}", str(e)) from e
        for a in ("schema", "table", "column", "message.prefix"):
            b = a.replace(".", "_")
            if getattr(self, f"{b}_include_list") and getattr(self, f"{b}_exclude_list"):
                raise FieldError(
                    f"{a}.exclude.list",
                    f"{a}.include.list and {a}.exclude.list are mutually exclusive: keep one",
                )
        topic = self.notification_sink_topic_name
        if "sink" in self.notification_enabled_channels.names and topic is None:
            raise FieldError(
                "notification.sink.topic.name",
                "is required when notification.enabled.channels includes sink: name the "
                "record, for example notifications (<root>/_state/notifications.jsonl)",
            )
        if topic is not None and (not _TOPIC_NAME.fullmatch(topic) or topic in (".", "..")):
            raise FieldError(
                "notification.sink.topic.name",
                f"{topic!r} is not a topic name (letters, digits, '.', '_' and '-', at most 249)",
            )
        self._check_query_timeout()
        object.__setattr__(self, "dsn", dataclasses.replace(
            self.dsn, query_timeout_s=self.query_timeout_s,
            initial_statements=self.database_initial_statements.items,
        ))  # fmt: skip
        if self.heartbeat_interval_ms < 0:
            raise FieldError("heartbeat.interval.ms", f"{self.heartbeat_interval_ms} is negative")
        if self.guardrail_collections_max < 0:
            raise FieldError("guardrail.collections.max",
                             f"{self.guardrail_collections_max} is negative: give the most "
                             "tables to capture, or 0 for no limit")  # fmt: skip
        if self.retained_wal_fail and self.retained_wal_fail <= self.retained_wal_warn:
            raise FieldError(
                "retained_wal_fail",
                f"{self.retained_wal_fail} bytes is not above retained_wal_warn "
                f"({self.retained_wal_warn} bytes): make it larger, or 0 to turn it off",
            )
        if not _SLOT_NAME.fullmatch(self.slot):
            raise FieldError(
                "slot",
                f"{self.slot!r} is not a valid replication slot name "
                "(lower-case letters, digits and _ only, at most 63)",
            )
        if not self.publication.strip():
            raise FieldError("publication", "the name is empty")
        if len(self.publication.encode()) > MAX_IDENTIFIER_BYTES:  # the server would cut it
            raise FieldError(
                "publication",
                f"{self.publication!r} is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes "
                "(the server would cut it, and two pipelines could share the cut name)",
            )
        self._check_tables()

    def _check_tables(self) -> None:
        if not self.tables:
            object.__setattr__(self, "discovered", True)
            if not (self.schema_include_list or self.table_include_list):
                raise FieldError(
                    "tables",
                    "list the tables to capture (schema.table), or give source.table.include.list "
                    "or source.schema.include.list to capture the tables they match, found in the "
                    "source's catalog at every run (a whole database is never captured by default)",
                )
            return
        check_names(self.tables)
        kept = tuple(t for t in self.tables if self.captures(t))
        if not kept:
            raise FieldError(
                "tables", "the include and exclude lists leave no table of this list to capture"
            )
        object.__setattr__(self, "tables", kept)

    @property
    def tables_key(self) -> str:
        """The key that chooses the captured tables, as messages name it: source.tables, or
        the include list of a source without it."""
        if not self.discovered:
            return "source.tables"
        return f"source.{'table' if self.table_include_list else 'schema'}.include.list"

    @property
    def awaits_discovery(self) -> bool:
        """`source.tables` is omitted and the source's catalog has not been read yet
        (`cdc_core.pg.discover`): every reader of `tables` waits for `with_discovered`."""
        return not self.tables

    def with_discovered(self, tables: Sequence[TableName]) -> SourceConfig:
        """This source capturing `tables`, found in its catalog; raises `FieldError` as the
        load would for names the lake cannot hold. (Not `dataclasses.replace`: the loaded
        values, the DSN with its password file's password, are taken as they are.)"""
        check_names(tuple(tables))
        found = copy.copy(self)
        object.__setattr__(found, "tables", tuple(tables))
        object.__setattr__(found, "discovered", True)
        return found

    def with_dropped(self, dropped: Sequence[DroppedTable]) -> SourceConfig:
        """This source without the `dropped` tables in `tables`: their changes made before the
        drop are followed (`followed`) until silver has applied them (`cdc_core.dropped`)."""
        gone = {d.table for d in dropped}
        found = copy.copy(self)
        object.__setattr__(found, "tables", tuple(t for t in self.tables if t not in gone))
        object.__setattr__(found, "dropped", tuple(dropped))
        return found

    @property
    def followed(self) -> tuple[TableName, ...]:
        """The tables whose changes the stream is read for: the captured ones and the dropped
        ones whose last changes silver has not applied yet."""
        return self.tables + tuple(d.table for d in self.dropped if not d.applied)

    def _check_placeholder(self) -> None:
        try:
            placeholder_octets(self.unavailable_value_placeholder)
        except ValueError as e:
            raise FieldError("unavailable.value.placeholder", str(e)) from e

    def _check_query_timeout(self) -> None:
        if self.query_timeout_s < 0:
            raise FieldError(
                "query_timeout_s",
                f"{self.query_timeout_s} is negative: give the seconds a query may run, "
                "or 0 for no limit",
            )
        if self.query_timeout_s * 1000 > _PG_INT_MAX:  # statement_timeout is milliseconds
            raise FieldError(
                "query_timeout_s",
                f"{self.query_timeout_s} is more than PostgreSQL's statement_timeout takes "
                f"({_PG_INT_MAX // 1000} s, about 24 days): give fewer seconds, or 0 for no limit",
            )

    def _add_password(self) -> None:
        """Put the password of `password_file` in the DSN (loaded once, like every value)."""
        if self.password_file is None:
            return
        path = os.path.expanduser(self.password_file)
        if self.dsn.has_password:
            raise FieldError("password_file", "source.dsn holds a password already: keep one")
        try:
            with open(path, encoding="utf-8") as f:
                password = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            why = (e.strerror or type(e).__name__) if isinstance(e, OSError) else "not UTF-8"
            raise FieldError(
                "password_file", f"cannot read {path!r}: {why} (a file holding only the password)"
            ) from None
        if not password:
            raise FieldError("password_file", f"{path!r} is empty: write the password in it")
        object.__setattr__(self, "dsn", self.dsn.with_password(password))

    def captures(self, table: TableName) -> bool:
        """Whether the schema and table filters let `table` through."""
        s, t = self.schema_include_list, self.table_include_list
        if s and not s.matches(table.schema):
            return False
        if self.schema_exclude_list.matches(table.schema):
            return False
        qualified = f"{table.schema}.{table.name}"
        if t and not t.matches(qualified):
            return False
        return not self.table_exclude_list.matches(qualified)

    def column_rules(self) -> ColumnRules:
        """The column filters and transforms, ready to plan each table's rewrite."""
        return ColumnRules(
            self.column_include_list.patterns, self.column_exclude_list.patterns,
            tuple(Rule.parse(k, v) for k, v in self.column_transforms.items()),
        )  # fmt: skip

    def keeps_message(self, prefix: str) -> bool:
        """Whether a logical decoding message with this prefix is staged (op=m)."""
        include = self.message_prefix_include_list
        if include and not include.matches(prefix):
            return False
        return not self.message_prefix_exclude_list.matches(prefix)


@dataclass(frozen=True)
class SnapshotConfig:
    """How the mirror starts: which rows are read before the stream takes over."""

    mode: SnapshotMode = field(
        default="initial",
        metadata=meta(
            "when to snapshot: initial (no stored position or unfinished snapshot), always, "
            "initial_only (snapshot then stop), no_data (never; 'never' is a deprecated alias), "
            "when_needed (also when the stored position is gone from the server)",
            debezium="snapshot.mode",
            aliases={"never": "no_data"},
        ),
    )
    chunk_size: int = field(
        default=100_000,
        metadata=meta("rows per chunk: a chunk is one Spark task reading one key range",
                      key="chunk.size", debezium="incremental.snapshot.chunk.size"),
    )  # fmt: skip
    max_threads: int = field(
        default=4,
        metadata=meta("chunks read at once under one MVCC snapshot (JDBC connections); a killed "
                      "snapshot re-reads at most this many", key="max.threads",
                      debezium="snapshot.max.threads"),
    )  # fmt: skip
    fetch_size: int = field(
        default=10_240,
        metadata=meta("rows per JDBC fetch", key="fetch.size", debezium="snapshot.fetch.size"),
    )
    lock_timeout_ms: int = field(
        default=10_000,
        metadata=meta("how long a snapshot read waits for its ACCESS SHARE lock on the table "
                      "(held only while the read takes its snapshot and reads; an ALTER TABLE, "
                      "TRUNCATE or VACUUM FULL in progress holds it off); past it the run exits "
                      "75 and the next one tries again", key="lock.timeout.ms",
                      debezium="snapshot.lock.timeout.ms"),
    )  # fmt: skip
    tables_order_by_row_count: TablesOrder = field(
        default="disabled",
        metadata=meta("the order an initial or blocking snapshot reads its tables in: "
                      "disabled (as listed, or schema and name order when found), ascending "
                      "(fewest rows first: small mirrors are ready early) or descending (most "
                      "rows first); rows as the planner estimates them, exact below 80 MB",
                      key="tables.order.by.row.count",
                      debezium="snapshot.tables.order.by.row.count"),
    )  # fmt: skip
    signal_data_collection: TableName | None = field(
        default=None,
        metadata=meta("Debezium's signalling table (id, type, data), read at the start of every "
                      "run and between snapshot reads: execute-snapshot, stop-snapshot, "
                      "pause-snapshot and resume-snapshot", key="signal.data.collection",
                      debezium="signal.data.collection", example="public.debezium_signal"),
    )  # fmt: skip
    signal_enabled_channels: SignalChannels = field(
        default=SignalChannels(),
        metadata=meta("where signals come from: source (the signal.data.collection table) and "
                      "file (signal.file); Debezium's kafka and jmx are not supported",
                      key="signal.enabled.channels", debezium="signal.enabled.channels"),
    )  # fmt: skip
    signal_file: str = field(
        default="file-signals.txt",
        metadata=meta("the file channel's file: one JSON signal per line, taken out of the "
                      "file once recorded; a relative path is relative to the pipeline file's "
                      "folder (pipelines/)", key="signal.file", debezium="signal.file"),
    )  # fmt: skip

    include_collection_list: RegexList = field(
        default=RegexList(),
        metadata=meta("the captured tables the initial snapshot (and a later-added table's first "
                      "snapshot) reads, by schema.table; the others start empty and stream. "
                      "Signals and cdc snapshot are not limited by it. Empty: all",
                      key="include.collection.list",
                      debezium="snapshot.include.collection.list", example="public.orders"),
    )  # fmt: skip

    select_statement_overrides: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=meta("per table (schema.table), the SELECT a table's snapshots read instead "
                      "of the whole table: the initial one (and always, when_needed), a "
                      "later-added or recreated table's first one, and blocking snapshots "
                      "(a signal's additional-conditions win). It must return every captured "
                      "column by name; it is read in chunks by the key. Incremental snapshots "
                      "asked for by signal or cdc snapshot read the table, as in Debezium; "
                      "changes always stream for every row",
                      key="select.statement.overrides",
                      debezium="snapshot.select.statement.overrides.<schema>.<table>"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        overrides: set[TableName] = set()
        for key, query in self.select_statement_overrides.items():
            where = f"select.statement.overrides.{key}"
            try:
                table = TableName.parse(key)
            except ValueError as e:
                raise FieldError(where, f"{e} (the key names a table: schema.table)") from e
            if table in overrides:
                raise FieldError(where, f"{table} has two SELECT statements")
            if not _SELECT.match(query):
                raise FieldError(where, f"{query.strip()[:80]!r} is not a SELECT statement "
                                 "(write SELECT ... FROM ...)")  # fmt: skip
            overrides.add(table)
        for key, value in (("chunk.size", self.chunk_size), ("max.threads", self.max_threads),
                           ("fetch.size", self.fetch_size),
                           ("lock.timeout.ms", self.lock_timeout_ms)):  # fmt: skip
            if value < 1:
                raise FieldError(key, f"{value} must be at least 1")
            if value > _PG_INT_MAX:  # a JDBC fetch size and lock_timeout are 32-bit
                raise FieldError(key, f"{value} must be at most {_PG_INT_MAX}")
        if not self.signal_file.strip():
            raise FieldError("signal.file", "the path is empty (Debezium's default: "
                             "file-signals.txt, next to the pipeline file)")  # fmt: skip
        object.__setattr__(self, "signal_file", os.path.expanduser(self.signal_file.strip()))

    def select_for(self, table: TableName) -> str | None:
        """The SELECT `table`'s whole-table snapshots read (select.statement.overrides)."""
        for key, value in self.select_statement_overrides.items():
            if TableName.parse(key) == table:
                return value.strip().rstrip(";").rstrip()
        return None

    def reads_first(self, table: TableName) -> bool:
        """Whether the initial snapshot (or a later-added table's first one) reads `table`."""
        include = self.include_collection_list
        return not include or include.matches(f"{table.schema}.{table.name}")


@dataclass(frozen=True)
class TargetConfig:
    """The lake side: where bronze, silver, staging and state live."""

    root: str = field(
        metadata=meta(
            "root of this pipeline's lake: a local or mounted path (a Databricks volume "
            "/Volumes/..., an NFS mount), a file: URI, or an S3 location s3a://bucket/prefix "
            "(reached with the environment's spark.hadoop.fs.s3a.* settings); relative paths "
            "are relative to the working directory",
            example="${LAKE_ROOT:-./lake}/orders",
        )
    )

    def __post_init__(self) -> None:
        root = self.root.strip()
        if not root:
            raise FieldError("root", "the path is empty")
        uri = _URI.match(root)
        scheme, slashes, rest = (
            (uri.group(1).lower(), uri.group(2), root[uri.end() :]) if uri else ("", "", root)
        )
        if scheme == "s3a":
            if not slashes:
                raise FieldError("root", f"{root}: an S3 location has two slashes: "
                                 "s3a://bucket/prefix")  # fmt: skip
            if not rest.strip("/"):
                raise FieldError("root", f"{root}: name a bucket (s3a://bucket/prefix)")
            parts = [part for part in rest.split("/") if part]  # no empty names in keys
            object.__setattr__(self, "root", f"s3a://{'/'.join(parts)}")
            return
        if scheme == "file":  # file:///x, file:/x, file://localhost/x: the local path /x
            host, _, path = rest.partition("/") if slashes else ("", "/", rest)
            if host not in ("", "localhost"):
                raise FieldError("root", f"{root}: a file: URI names a path on this machine "
                                 f"(file:///path), not on host {host!r}")  # fmt: skip
            root = "/" + path.lstrip("/")
        elif scheme:  # a URI of a file system the driver cannot write its own files to
            raise FieldError("root", f"{root}: the {scheme}: file system is not supported"
                             f"{_ROOT_HINTS.get(scheme, '')}. Use a local path, a mounted one (a "
                             "Databricks volume /Volumes/..., an NFS mount), file: or "
                             "s3a://bucket/prefix")  # fmt: skip
        if "\0" in root:
            raise FieldError("root", f"{root!r}: a path cannot hold a NUL character")
        root = os.path.abspath(os.path.expanduser(root))
        if os.path.exists(root) and not os.path.isdir(root):
            raise FieldError("root", f"{root} is a file, not a directory: the lake is a "
                             "directory (created if missing)")  # fmt: skip
        object.__setattr__(self, "root", root.rstrip("/") or "/")


_SELECT = re.compile(r"\s*(\(\s*)*(SELECT|WITH|VALUES|TABLE)\b", re.IGNORECASE)
"""The start of a query that returns rows (a statement override is read as a subquery)."""
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(?=/)(//)?")
"""A URI: its scheme, then `:/` or `://` (`dbfs:/x`, `s3a://x`, `file:///x`); `./x:/y`,
`/x:/y` and `x:y` are paths."""
_ROOT_HINTS = {
    "s3": " (write s3a:// for S3: Spark's s3a connector)",
    "s3n": " (write s3a:// for S3: Spark's s3a connector)",
    "dbfs": " (on Databricks, use a volume /Volumes/... or the /dbfs/... mount)",
}


@dataclass(frozen=True)
class CaptureConfig:
    """How changes are read from the slot and staged."""

    chunk_changes: int = field(
        default=50_000,
        metadata=meta("changes of one transaction held in memory before they are spilled "
                      "to its staged file; bounds the reader's memory"),
    )  # fmt: skip
    chunk_bytes: ByteSize = field(
        default=ByteSize(64 << 20), metadata=meta("the same bound in bytes of WAL messages")
    )
    file_changes: int = field(
        default=1_000_000,
        metadata=meta("a staged file is closed at the first commit past this many changes"),
    )
    file_bytes: ByteSize = field(
        default=ByteSize(256 << 20), metadata=meta("or past this many bytes")
    )
    peek_changes: int = field(
        default=1_000_000,
        metadata=meta("source.reader sql: changes per peek (checked between transactions); the "
                      "server keeps a peek's result in a temporary file past work_mem"),
    )  # fmt: skip
    compression: Literal["zstd", "snappy", "none"] = field(
        default="zstd", metadata=meta("Parquet compression of staged files")
    )
    retries: int = field(
        default=5,
        metadata=meta("transient failures (lost connection, server restart) retried within a "
                      "run before it exits with code 75; -1: no limit, the run waits for the "
                      "source however long it is gone (Debezium's errors.max.retries -1)",
                      debezium="errors.max.retries"),
    )  # fmt: skip
    retry_backoff_s: float = field(
        default=1.0, metadata=meta("first wait between retries; doubles each time, at most 30 s")
    )
    trigger_interval_s: float = field(
        default=5.0,
        metadata=meta("--continuous: a batch starts at most this often (seconds); one that "
                      "takes longer is followed at once"),
    )  # fmt: skip

    metrics_table_interval_s: float = field(
        default=60.0,
        metadata=meta("how often the batch lines are appended to the Delta metrics table "
                      "_state/metrics (seconds; 0: every batch), across --once runs too (by "
                      "the table's last commit) and at the end of --continuous; the JSON "
                      "lines and the Prometheus textfile are written every batch"),
    )  # fmt: skip

    batch_lines_retention_days: int | None = field(
        default=7,
        metadata=meta("drop the lines of _state/batches.jsonl older than this many days once "
                      "the Delta metrics table holds them (it keeps the whole history; the "
                      "newest line always stays); checked when the table is appended to, the "
                      "file rewritten about once a day; unset: keep every line"),
    )  # fmt: skip

    def gives_up(self, failures: int) -> bool:
        """Whether a run stops (exit 75) after `failures` transient failures in a row."""
        return 0 <= self.retries < failures

    def __post_init__(self) -> None:
        if self.batch_lines_retention_days is not None and self.batch_lines_retention_days < 1:
            raise FieldError(
                "batch_lines_retention_days",
                f"{self.batch_lines_retention_days} must be at least 1 (or unset: keep every line)",
            )
        for key in ("chunk_changes", "file_changes", "peek_changes"):
            if getattr(self, key) < 1:
                raise FieldError(key, f"{getattr(self, key)} must be at least 1")
        if self.retries < -1:
            raise FieldError("retries", f"{self.retries} must be 0 or more, or -1 (no limit)")
        for key in ("retry_backoff_s", "trigger_interval_s", "metrics_table_interval_s"):
            if getattr(self, key) < 0:
                raise FieldError(key, f"{getattr(self, key)} is negative")
            if getattr(self, key) > MAX_WAIT_S:  # a wait past Python's own limit fails mid-run
                raise FieldError(
                    key, f"{getattr(self, key)} is more than {MAX_WAIT_S:,} s (a year)"
                )


MAX_WAIT_S = 31_536_000
"""The longest wait a setting in seconds may ask for: a year (`threading`'s own limit, some
292 years, fails a `--continuous` run between batches)."""


@dataclass(frozen=True)
class SilverConfig:
    """How the typed silver mirrors are kept; type modes carry Debezium's names and values."""

    soft_delete: bool = field(
        default=False,
        metadata=meta("keep deleted rows, marked _cdc_deleted = true, instead of deleting them; "
                      "switched off, the next run removes the rows it left marked"),
    )  # fmt: skip
    max_threads: int = field(
        default=3,
        metadata=meta("how many mirrors a batch merges at once, each in a Spark session of its "
                      "own: one's planning, commit and JIT compiling overlap another's tasks "
                      "(on 2 cores, 3 took a batch of three mirrors from 11.1 to 9.4 s); 1 "
                      "merges them one after the other"),
    )  # fmt: skip
    decimal_handling_mode: Literal["precise", "double", "string"] = field(
        default="precise",
        metadata=meta(
            "precise: numeric(p,s) with p <= 38 as decimal(p,s), other numerics as exact "
            "strings; double: as double (approximate); string: as strings",
            key="decimal.handling.mode", debezium="decimal.handling.mode",
        ),
    )  # fmt: skip
    money_fraction_digits: int = field(
        default=2,
        metadata=meta("the scale of money values with decimal.handling.mode precise: silver's "
                      f"decimal(17 + n, n), rounded half up; 0 to {MAX_MONEY_DIGITS}. The "
                      "double and string modes do not use it",
                      key="money.fraction.digits", debezium="money.fraction.digits"),
    )  # fmt: skip
    time_precision_mode: Literal[
        "adaptive", "adaptive_time_microseconds", "microseconds", "nanoseconds", "isostring",
        "connect",
    ] = field(
        default="adaptive",
        metadata=meta(
            "how time (of day) is typed: adaptive (ms for time(0-3), else microseconds), "
            "microseconds, nanoseconds (bigint, Debezium's NanoTime; exact), isostring, connect "
            "(ms, loses precision); dates and timestamps are Spark's in every mode",
            key="time.precision.mode", debezium="time.precision.mode",
        ),
    )  # fmt: skip
    interval_handling_mode: Literal["string", "numeric"] = field(
        default="string",
        metadata=meta(
            "string: exact ISO-8601 (P1Y2M3DT4H5M6.78S); numeric: microseconds, months as "
            "30.4375 days (Debezium's default; approximate)",
            key="interval.handling.mode", debezium="interval.handling.mode",
        ),
    )  # fmt: skip
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = field(
        default="bytes",
        metadata=meta("bytea as binary, or as strings in base64, base64-url-safe or hex",
                      key="binary.handling.mode", debezium="binary.handling.mode"),
    )  # fmt: skip
    hstore_handling_mode: Literal["json", "map"] = field(
        default="json",
        metadata=meta("hstore as a JSON string, or as map<string,string>",
                      key="hstore.handling.mode", debezium="hstore.handling.mode"),
    )  # fmt: skip
    event_processing_failure_handling_mode: FailureMode = field(
        default="fail",
        metadata=meta("a change silver cannot apply (a key value its silver type cannot hold, a "
                      "value it cannot read): fail stops that table's mirror there (the others "
                      "go on); warn and skip apply the rest of the batch and write the change "
                      "to the Delta table _state/dead_letters, warn logging a line per change, "
                      "skip a count per table",
                      key="event.processing.failure.handling.mode",
                      debezium="event.processing.failure.handling.mode"),
    )  # fmt: skip
    column_propagate_source_type: RegexList = field(
        default=RegexList(),
        metadata=meta("silver columns whose schema.table.column matches carry their source "
                      "type in the Delta field metadata: __debezium.source.column.type, "
                      ".length and .scale, as when the column was created in silver",
                      key="column.propagate.source.type",
                      debezium="column.propagate.source.type"),
    )  # fmt: skip
    datatype_propagate_source_type: RegexList = field(
        default=RegexList(),
        metadata=meta("the same, for columns whose schema.table.<type name> matches, with "
                      "PostgreSQL's type name (e.g. public.orders.varchar, .*\\.numeric)",
                      key="datatype.propagate.source.type",
                      debezium="datatype.propagate.source.type"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.max_threads < 1:
            raise FieldError("max_threads", f"{self.max_threads} must be at least 1")
        digits = self.money_fraction_digits
        if not 0 <= digits <= MAX_MONEY_DIGITS:
            raise FieldError(
                "money.fraction.digits",
                f"{digits} is not between 0 and {MAX_MONEY_DIGITS}: money has at most 17 "
                f"integer digits, and decimal(17 + n, n) must fit Spark's 38",
            )


_CENTURY_H = 876_600  # hours in 100 years (of 365.25 days): the longest retention taken


@dataclass(frozen=True)
class MaintenanceConfig:
    """What `jobs/maintain.py` does: compaction, VACUUM, removal of applied staged files, bronze
    retention."""

    optimize: bool = field(
        default=True,
        metadata=meta("compact small files (Delta OPTIMIZE) of bronze, every silver mirror, "
                      "the transactions table and the metrics, notifications and dead-letter "
                      "tables"),
    )  # fmt: skip
    vacuum: bool = field(
        default=True,
        metadata=meta("remove the files of those tables that no version inside the retention "
                      "uses any more (Delta VACUUM)"),
    )  # fmt: skip
    vacuum_retention_hours: int = field(
        default=168,
        metadata=meta("VACUUM keeps every file a table version of the last this many hours "
                      "uses; below Delta's safety minimum of 168 (7 days) only with "
                      "vacuum_retention_check: false"),
    )  # fmt: skip
    vacuum_retention_check: bool = field(
        default=True,
        metadata=meta("keep Delta's check (spark.databricks.delta.retentionDurationCheck."
                      "enabled) that refuses a retention below 168 hours; false turns it off "
                      "for maintenance's VACUUM only, and then no query or ingest run may last "
                      "longer than the retention, or it loses files it reads"),
    )  # fmt: skip
    staged_retention_hours: int = field(
        default=24,
        metadata=meta("a staged change file is removed once bronze holds it and it is older "
                      "than this (modification time); a file not yet in bronze never is, nor "
                      "the newest one (capture resumes after it)"),
    )  # fmt: skip
    bronze_retention_days: int | None = field(
        default=None,
        metadata=meta("delete bronze rows committed more than this many days ago, but only "
                      "rows silver has merged (never one past its table's silver watermark); "
                      "logical decoding messages by age alone; unset: keep bronze forever, "
                      "0: every merged row. A mirror dropped afterwards is rebuilt from a "
                      "snapshot (`cdc snapshot`), not from bronze"),
    )  # fmt: skip
    snapshot_jobs_retention_days: int | None = field(
        default=30,
        metadata=meta("remove a finished snapshot job's record (_state/snapshots/finished, "
                      "what cdc status lists) this many days after the run that archived it; "
                      "the newest finished initial snapshot always stays (snapshot.mode "
                      "decides by it); snapshot notifications, when on, keep every snapshot's "
                      "record. Unset (null): keep them all"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        for key, most in (("vacuum_retention_hours", _CENTURY_H),
                          ("staged_retention_hours", _CENTURY_H),
                          ("bronze_retention_days", _CENTURY_H // 24),
                          ("snapshot_jobs_retention_days", _CENTURY_H // 24)):  # fmt: skip
            value = getattr(self, key)
            if value is not None and value < 0:
                raise FieldError(key, f"{value} is negative: give 0 or more")
            if value is not None and value > most:  # a cutoff past 64 bits of ms crashed in Spark
                raise FieldError(key, f"{value} is more than a century: give at most {most}"
                                 + (", or leave it unset to keep bronze whole"
                                    if key == "bronze_retention_days" else ""))  # fmt: skip
        if self.vacuum_retention_check and self.vacuum_retention_hours < SAFE_VACUUM_HOURS:
            raise FieldError(
                "vacuum_retention_hours",
                f"{self.vacuum_retention_hours} is below Delta's safety minimum of "
                f"{SAFE_VACUUM_HOURS} hours (7 days), which protects queries and ingest runs "
                "still reading older files; raise it, or set vacuum_retention_check: false "
                "if nothing runs longer than that",
            )


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline file: what is captured, and where it lands."""

    name: str = field(metadata=meta("the pipeline's name; the file is pipelines/<name>.yaml"))
    source: SourceConfig = field(metadata=meta("the PostgreSQL source"))
    target: TargetConfig = field(metadata=meta("the lake"))
    snapshot: SnapshotConfig = field(
        default_factory=SnapshotConfig, metadata=meta("initial snapshot behaviour")
    )
    capture: CaptureConfig = field(
        default_factory=CaptureConfig, metadata=meta("reading the slot and staging")
    )
    silver: SilverConfig = field(default_factory=SilverConfig, metadata=meta("the silver mirrors"))
    maintenance: MaintenanceConfig = field(
        default_factory=MaintenanceConfig,
        metadata=meta("jobs/maintain.py: compaction, VACUUM, staged files, bronze retention"),
    )
    validate: ValidateConfig = field(
        default_factory=ValidateConfig,
        metadata=meta("cdc validate: value constraints checked on the silver mirrors"),
    )

    def __post_init__(self) -> None:
        if not _PIPELINE_NAME.fullmatch(self.name):
            raise FieldError(
                "name",
                f"{self.name!r} is not a valid pipeline name "
                "(letters, digits, _ and -, starting with a letter or digit)",
            )
        if not self.source.awaits_discovery:  # else checked once the tables are found
            self.check_tables()

    def check_tables(self) -> None:
        """The keys that name captured tables name some: raises `FieldError`."""
        captured = {str(t): t for t in self.source.tables}
        for pattern in self.snapshot.include_collection_list.patterns:
            if not any(matches(pattern, f"{t.schema}.{t.name}") for t in self.source.tables):
                raise FieldError(
                    "snapshot.include.collection.list",
                    f"{pattern!r} matches none of the captured tables ({', '.join(captured)}): "
                    "it names tables by schema.table, among source.tables",
                )
        for key in self.snapshot.select_statement_overrides:
            table = TableName.parse(key)
            if table not in self.source.tables:
                raise FieldError(
                    f"snapshot.select.statement.overrides.{key}",
                    f"{table} is not captured by this pipeline (it captures "
                    f"{', '.join(captured)}){suggest(str(table), captured)}",
                )
        for i, expectation in enumerate(self.validate.expectations):
            if expectation.table not in self.source.tables:
                raise FieldError(
                    f"validate.expectations[{i}].table",
                    f"{expectation.table} is not captured by this pipeline (it captures "
                    f"{', '.join(captured)}){suggest(str(expectation.table), captured)}",
                )


@dataclass(frozen=True)
class SparkSettings:
    """How the SparkSession is built; ignored keys never reach Spark silently."""

    master: str = field(
        default="local[*]",
        metadata=meta("master used when not launched by spark-submit (which sets its own)"),
    )
    jars: JarsMode = field(
        default="resolve",
        metadata=meta(
            "resolve: fetch the Delta and PostgreSQL JDBC jars from Maven Central once, cache "
            "them and add them; provided: the cluster already has them (Databricks), add nothing"
        ),
    )
    packages: tuple[str, ...] = field(
        default=(),
        metadata=meta(
            "extra Maven coordinates group:artifact:version to resolve with jars: resolve "
            "(Hadoop's s3a connector, hadoop-aws of Spark's Hadoop version, is added by itself "
            "when the lake is on s3a:// or spark.hadoop.fs.s3a.* is set)"
        ),
    )
    conf: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=meta(
            "Spark settings passed through as they are, e.g. spark.sql.shuffle.partitions"
        ),
    )

    def __post_init__(self) -> None:
        for coordinate in self.packages:
            if len(coordinate.split(":")) != 3:
                raise FieldError(
                    "packages", f"{coordinate!r} is not a Maven coordinate group:artifact:version"
                )
        for key in self.conf:
            if not key.startswith("spark."):
                raise FieldError(
                    "conf", f"{key!r} is not a Spark setting (they start with 'spark.')"
                )


@dataclass(frozen=True)
class CatalogSettings:
    """Registration of the silver mirrors in the Spark catalog."""

    register: bool = field(
        default=False,
        metadata=meta("register each silver table so users can SELECT ... FROM it"),
    )
    database: str = field(
        default="cdc_{schema}",
        metadata=meta("catalog database the mirrors are registered in; {schema} is the source "
                      "schema, so public.customers becomes cdc_public.customers"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        try:
            fields = [f + (f"!{c}" if c else "") + (f":{spec}" if spec else "")
                      for _, f, spec, c in string.Formatter().parse(self.database)
                      if f is not None]  # fmt: skip
        except ValueError as e:  # a lone { or }
            raise FieldError("database", f"{self.database!r}: {e} (write {{{{ and }}}} for a "
                             "literal brace)") from e  # fmt: skip
        unknown = [f for f in fields if f != "schema"]
        if unknown:
            raise FieldError("database", f"{self.database!r}: unknown placeholder "
                             f"{{{unknown[0]}}}; the only one is {{schema}}")  # fmt: skip
        if not self.database.format(schema="public").strip():
            raise FieldError("database", "the name is empty")


@dataclass(frozen=True)
class EnvConfig:
    """One environment file: where and how pipelines run."""

    spark: SparkSettings = field(default_factory=SparkSettings, metadata=meta("Spark settings"))
    catalog: CatalogSettings = field(
        default_factory=CatalogSettings, metadata=meta("Spark catalog registration")
    )


@dataclass(frozen=True)
class Config:
    """A pipeline together with the environment it runs in."""

    pipeline: PipelineConfig
    env: EnvConfig
    env_name: str
    pipeline_file: str
    env_file: str


def check_names(tables: tuple[TableName, ...]) -> None:
    """Each table once; names that give each mirror a directory of its own, and bronze rows
    that say which table they belong to."""
    seen: dict[str, TableName] = {}
    for t in tables:
        other = seen.setdefault(t.qualified, t)
        if other is not t:
            clash = (
                f"{other} and {t} are both {t.qualified} in bronze (source.table, as Debezium "
                "writes it): capture one of them, or rename one in PostgreSQL"
            )
            raise FieldError("tables", f"{t} is listed twice" if other == t else clash)
        if any(part in (".", "..") or "/" in part for part in (t.schema, t.name)):
            raise FieldError(
                "tables",
                f"{t} cannot be a directory of the lake (silver/<schema>/<table>): a name '.' "
                "or '..' or with '/' would put its mirror elsewhere; rename it in PostgreSQL",
            )
