"""What a pipeline file (`pipelines/NAME.yaml`) and an environment file (`conf/ENV.yaml`) hold."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from cdc_core.config.loader import FieldError, meta
from cdc_core.identifiers import TableName

SnapshotMode = Literal["initial", "always", "initial_only", "no_data", "when_needed"]
JarsMode = Literal["resolve", "provided"]
ReaderMode = Literal["stream", "sql"]
AutocreateMode = Literal["filtered", "all_tables", "disabled"]
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}  # fmt: skip

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


@dataclass(frozen=True)
class Dsn:
    """A libpq connection string; prints without its password."""

    conninfo: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> Dsn:
        text = text.strip()
        if not text:
            raise ValueError(
                "the connection string is empty (for example postgresql://user@127.0.0.1:5432/shop)"
            )
        return cls(text)

    @property
    def redacted(self) -> str:
        """The connection string with any password replaced by `***`."""
        if "://" in self.conninfo:
            parts = urlsplit(self.conninfo)
            netloc = parts.netloc
            if "@" in netloc:
                userinfo, host = netloc.rsplit("@", 1)
                if ":" in userinfo:
                    netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
            query = _PASSWORD_KV.sub(r"\1***", parts.query.replace("&", " ")).replace(" ", "&")
            return urlunsplit(parts._replace(netloc=netloc, query=query))
        return _PASSWORD_KV.sub(r"\1***", self.conninfo)

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"Dsn({self.redacted!r})"


class ByteSize(int):
    """A size in bytes, written as 67108864, 64MiB or 64MB."""

    @classmethod
    def parse(cls, text: str) -> ByteSize:
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _BYTE_UNITS:
            raise ValueError(f"{text!r} is not a size (write bytes, or e.g. 64MiB, 512KB, 1GiB)")
        return cls(int(m.group(1)) * _BYTE_UNITS[unit])


@dataclass(frozen=True)
class SourceConfig:
    """The PostgreSQL side: where to connect and what to capture."""

    dsn: Dsn = field(
        metadata=meta(
            "libpq connection string of the source database (URI or key=value); "
            "keep passwords in the environment: ${VAR} or ${VAR:-default}",
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
        metadata=meta(
            "tables to capture as schema.table; quote names with capitals, spaces or dots: "
            'public."Order Items"',
            debezium="table.include.list",
            example="[public.customers, public.orders]",
        )
    )

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

    def __post_init__(self) -> None:
        if not _SLOT_NAME.fullmatch(self.slot):
            raise FieldError(
                "slot",
                f"{self.slot!r} is not a valid replication slot name "
                "(lower-case letters, digits and _ only, at most 63)",
            )
        if not self.publication.strip():
            raise FieldError("publication", "the name is empty")
        if not self.tables:
            raise FieldError("tables", "list at least one table to capture, as schema.table")
        seen: set[TableName] = set()
        for t in self.tables:
            if t in seen:
                raise FieldError("tables", f"{t} is listed twice")
            seen.add(t)


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
    signal_data_collection: TableName | None = field(
        default=None,
        metadata=meta("Debezium's signalling table (id, type, data), read at the start of every "
                      "run: execute-snapshot and stop-snapshot", key="signal.data.collection",
                      debezium="signal.data.collection", example="public.debezium_signal"),
    )  # fmt: skip

    def __post_init__(self) -> None:
        for key, value in (("chunk.size", self.chunk_size), ("max.threads", self.max_threads),
                           ("fetch.size", self.fetch_size)):  # fmt: skip
            if value < 1:
                raise FieldError(key, f"{value} must be at least 1")


@dataclass(frozen=True)
class TargetConfig:
    """The lake side: where bronze, silver, staging and state live."""

    root: str = field(
        metadata=meta(
            "root of this pipeline's lake (a local path or a URI such as s3a://bucket/x); "
            "relative paths are relative to the working directory",
            example="${LAKE_ROOT:-./lake}/orders",
        )
    )

    def __post_init__(self) -> None:
        root = self.root.strip()
        if not root:
            raise FieldError("root", "the path is empty")
        if "://" not in root and not root.startswith("file:"):
            root = os.path.abspath(os.path.expanduser(root))
        object.__setattr__(self, "root", root.rstrip("/") or "/")


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
        default=100_000,
        metadata=meta("source.reader sql: changes per peek (checked between transactions)"),
    )
    compression: Literal["zstd", "snappy", "none"] = field(
        default="zstd", metadata=meta("Parquet compression of staged files")
    )
    retries: int = field(
        default=5,
        metadata=meta("transient failures (lost connection, server restart) retried within a "
                      "run before it exits with code 75"),
    )  # fmt: skip
    retry_backoff_s: float = field(
        default=1.0, metadata=meta("first wait between retries; doubles each time, at most 30 s")
    )

    def __post_init__(self) -> None:
        for key in ("chunk_changes", "file_changes", "peek_changes"):
            if getattr(self, key) < 1:
                raise FieldError(key, f"{getattr(self, key)} must be at least 1")
        if self.retries < 0:
            raise FieldError("retries", f"{self.retries} must be 0 or more")


@dataclass(frozen=True)
class SilverConfig:
    """How the typed silver mirrors are kept; type modes carry Debezium's names and values."""

    soft_delete: bool = field(
        default=False,
        metadata=meta("keep deleted rows, marked _cdc_deleted = true, instead of deleting them"),
    )
    decimal_handling_mode: Literal["precise", "double", "string"] = field(
        default="precise",
        metadata=meta(
            "precise: numeric(p,s) with p <= 38 as decimal(p,s), other numerics as exact "
            "strings; double: as double (approximate); string: as strings",
            key="decimal.handling.mode", debezium="decimal.handling.mode",
        ),
    )  # fmt: skip
    time_precision_mode: Literal[
        "adaptive", "adaptive_time_microseconds", "microseconds", "isostring", "connect"
    ] = field(
        default="adaptive",
        metadata=meta(
            "how time (of day) is typed: adaptive (ms for time(0-3), else microseconds), "
            "microseconds, isostring, connect (ms, loses precision)",
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

    def __post_init__(self) -> None:
        if not _PIPELINE_NAME.fullmatch(self.name):
            raise FieldError(
                "name",
                f"{self.name!r} is not a valid pipeline name "
                "(letters, digits, _ and -, starting with a letter or digit)",
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
            "(for example org.apache.hadoop:hadoop-aws:3.4.2 for s3a://)"
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
