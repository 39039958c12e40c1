"""Debezium connector properties as this product's pipeline keys: `cdc import-debezium`'s
translation, pure (properties in, pipeline data and a report of what was not carried over out).

The properties that map one to one come from the `debezium=` metadata of the config fields
(`model.py`), the one source of truth; this module holds only the conversions (the DSN, the
password, `plugin.name`, `snapshot.mode`, the table list, column transforms, the name) and the
properties that have no counterpart, each with its reason.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from cdc_core.config.loader import suggest, yaml_key
from cdc_core.config.model import (
    PipelineConfig,
    SnapshotConfig,
    SnapshotMode,
)
from cdc_core.errors import ConfigError
from cdc_core.name_patterns import split_patterns

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
_CONNECTOR_ALIASES = (POSTGRES_CONNECTOR, "PostgresConnector", "Postgres")  # Kafka Connect's
_CHANNEL_PROPS = ("signal.enabled.channels", "notification.enabled.channels")
_SECRETS = ("database.password", "database.sslpassword")  # never written, whatever they hold
DEBEZIUM_SLOT, DEBEZIUM_PUBLICATION = "debezium", "dbz_publication"  # Debezium's defaults
_OVERRIDES = "snapshot.select.statement.overrides"
_CONVERTED = frozenset({"database.password", "snapshot.mode", "table.include.list",
                        _OVERRIDES})  # fmt: skip
_DSN_PARAMS = {"database.sslmode": "sslmode", "database.sslcert": "sslcert",
               "database.sslkey": "sslkey", "database.sslrootcert": "sslrootcert"}  # fmt: skip
_DSN_PROPS = frozenset({"database.hostname", "database.port", "database.user",
                        "database.dbname", "database.sslpassword", "database.tcpKeepAlive",
                        *_DSN_PARAMS})  # fmt: skip
_NAME_PROPS = ("topic.prefix", "database.server.name", "name")
_TRANSFORM = re.compile(r"column\.(truncate\.to|mask\.with)\.\d+\.chars|column\.mask\.hash\..+")
_LEGACY = {  # Debezium 1.x names and their successors
    "schema.whitelist": "schema.include.list", "schema.blacklist": "schema.exclude.list",
    "table.whitelist": "table.include.list", "table.blacklist": "table.exclude.list",
    "column.whitelist": "column.include.list", "column.blacklist": "column.exclude.list",
    "toasted.value.placeholder": "unavailable.value.placeholder",
}  # fmt: skip
_DEBEZIUM_DEFAULTS = {"skipped.operations": "t", "interval.handling.mode": "numeric",
                      "publication.autocreate.mode": "all_tables",
                      "errors.max.retries": "-1"}  # fmt: skip
_MILLISECONDS = frozenset({"database.query.timeout.ms"})  # Debezium's ms, this product's seconds
_LEGACY_SNAPSHOT_MODES = {"schema_only": "no_data", "exported": "initial"}  # renamed, removed
_PLAIN_TABLE = re.compile(r"[a-z_][a-z0-9_]*\\?\.[a-z_][a-z0-9_]*")
_PROVIDER = re.compile(r"\$\{[^}:]*:[^}]*\}")  # a Kafka Connect config provider: ${file:path:key}

KAFKA_GROUPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Kafka Connect runs the connector; here `cdc`/ingest runs the pipeline",
     ("name", "connector.class", "tasks.max", "config.action.reload", "exactly.once.support",
      "transaction.boundary", "transaction.boundary.interval.ms", "retriable.restart.connector"
      ".wait.ms", "errors.tolerance", "errors.retry.timeout", "errors.retry.delay.max.ms"),
     ("offset.", "errors.log.", "errors.deadletterqueue.", "transaction.boundary.")),
    ("converters, transforms and predicates shape Kafka records; bronze holds the envelope "
     "and silver the typed rows", ("key.converter", "value.converter", "header.converter",
                                   "transforms", "predicates"),
     ("key.converter.", "value.converter.", "header.converter.", "transforms.", "predicates.")),
    ("topics, tombstones and headers are Kafka's; the lake has tables",
     ("tombstones.on.delete", "extended.headers.enabled", "database.server.name", "topic.prefix"),
     ("topic.", "signal.kafka.", "signal.consumer.", "schema.history.internal.",
      "database.history.", "notification.sink.topic.replication.")),
    ("Kafka client overrides", (), ("producer.", "consumer.", "admin.")),
    ("the Connect task's queue; a batch here is bounded by capture.* (changes and bytes)",
     ("max.batch.size", "max.queue.size", "max.queue.size.in.bytes", "poll.interval.ms"), ()),
    ("JVM only (Java classes, JMX)",
     ("database.sslfactory", "custom.metric.tags"), ()),
)  # fmt: skip

UNSUPPORTED: Mapping[str, str] = {
    "slot.drop.on.stop": "runs keep their slot between them; cdc retire drops it when the "
    "pipeline is taken out of service",
    "slot.stream.params": "the product chooses pgoutput's options itself",
    "slot.max.retries": "capture.retries and capture.retry_backoff_s bound retries in a run",
    "slot.retry.delay.ms": "see capture.retry_backoff_s",
    "database.autosave": "pgjdbc's savepoints: JDBC here runs single snapshot SELECTs",
    "status.update.interval.ms": "standby status updates are sent as the stream needs them",
    "include.unknown.datatypes": "always on: a type with no mapping (an extension's) is kept as "
    "its text, a string in silver (docs/type-mapping.md)",
    "schema.refresh.mode": "every Relation message refreshes the schema",
    "snapshot.isolation.mode": "snapshots read under an exported REPEATABLE READ snapshot",
    "snapshot.locking.mode": "snapshot chunks take ACCESS SHARE locks",
    "snapshot.locking.mode.custom.name": "custom Snapshot lock classes are Java",
    "snapshot.query.mode": "snapshots select every kept column",
    "snapshot.query.mode.custom.name": "custom snapshot query classes are Java",
    "snapshot.mode.custom.name": "custom Snapshotter classes are Java",
    "snapshot.delay.ms": "schedule the run later instead",
    "streaming.delay.ms": "a run streams right after its snapshot, in the same run",
    "snapshot.new.tables": "a table added to source.tables is snapshotted by itself",
    "flush.lsn.source": "the slot is confirmed once changes are durably staged",
    "publish.via.partition.root": "always on: a partitioned table streams into one mirror",
    "xmin.fetch.interval.ms": "source.xmin stays null, as under Debezium's default (0); cdc "
    "status shows the slot",
    "read.only": "watermarks are logical messages written on the source: use the primary",
    "incremental.snapshot.watermarking.strategy": "watermarks are logical messages, no rows",
    "incremental.snapshot.allow.schema.changes": "always on: each window reads the columns the "
    "table has under its lock, and gives way to DDL queued behind it",
    "schema.name.adjustment.mode": "mirror names are PostgreSQL's",
    "field.name.adjustment.mode": "column names are PostgreSQL's",
    "sanitize.field.names": "column names are PostgreSQL's",
    "converters": "custom converters are Java; silver types follow the type mapping",
    "signal.poll.interval.ms": "signals are read at the start of every run and between reads",
    "lsn.flush.timeout.ms": "the slot is confirmed past staged files as a run or batch ends",
    "lsn.flush.timeout.action": "see lsn.flush.timeout.ms",
    "post.processors": "Java classes; silver fills unchanged TOAST values from the mirror",
}
_UNSUPPORTED_PREFIXES = ("driver.",
                         "snapshot.mode.configuration.based.", "guardrail.",
                         "post.processors.")  # fmt: skip
_BASED = "snapshot.mode.configuration.based."
_BASED_FLAGS = ("snapshot.data", "start.stream", "snapshot.on.data.error", "snapshot.schema",
                "snapshot.on.schema.error")  # fmt: skip
# configuration_based's flags (snapshot.data, start.stream, snapshot.on.data.error) as the mode
# that behaves the same; the schema flags have nothing to act on (no schema history here)
_CONFIGURED_MODES = {(True, True, False): "always", (True, True, True): "always",
                     (False, True, False): "no_data"}  # fmt: skip
_NO_CONFIGURED_MODE = {
    (False, True, True): "a stream without a first snapshot that re-snapshots when its position "
    "is lost: when_needed also snapshots at the first start, no_data never does",
    (True, False): "a snapshot at every start without a stream: initial_only snapshots once",
    (False, False): "neither a snapshot nor a stream: the connector would do nothing",
}


@dataclass(frozen=True)
class Target:
    """Where a one-to-one property lands: the section, the key and the field's type."""

    section: str  # "" for the top level
    key: str
    tp: Any

    @property
    def path(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key


def mapped_properties() -> dict[str, Target]:
    """Debezium property -> pipeline key, from the `debezium=` metadata of the config fields
    (one property per field; fields that stand for several are converted here)."""
    return dict(_walk(PipelineConfig, ""))


def _walk(cls: type[Any], section: str) -> Iterator[tuple[str, Target]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], yaml_key(f)
        if dataclasses.is_dataclass(tp) and not hasattr(tp, "parse"):
            yield from _walk(typing.cast("type[Any]", tp), key)
            continue
        prop = f.metadata.get("debezium")
        if (
            isinstance(prop, str)
            and "," not in prop
            and "<" not in prop
            and (prop not in _CONVERTED or prop == "snapshot.mode")
        ):
            yield prop, Target(section, key, tp)


@dataclass
class Imported:
    """A translated connector: the pipeline's data and what became of every property."""

    name: str
    data: dict[str, dict[str, Any] | str]
    password_var: str | None = None
    secret_vars: list[str] = field(default_factory=list)  # what the file reads secrets from
    mapped: list[tuple[str, str]] = field(default_factory=list)  # (properties, where)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # reason -> properties
    unsupported: list[tuple[str, str]] = field(default_factory=list)  # (property, hint)
    unknown: list[tuple[str, str]] = field(default_factory=list)  # (property, suggestion)
    notes: list[str] = field(default_factory=list)

    @property
    def mapped_count(self) -> int:
        return sum(len(props.split(", ")) for props, _ in self.mapped)


def translate(props: Mapping[str, str], shown: str, name: str | None = None) -> Imported:
    """The pipeline for connector properties `props` read from file `shown`; a property whose
    value has no counterpart here raises `ConfigError` naming it."""
    props, renamed = _renamed(props)
    connector = props.get("connector.class")
    if connector is not None and connector.strip() not in _CONNECTOR_ALIASES:
        raise ConfigError(shown, "connector.class", f"{connector!r} is not Debezium's "
                          f"PostgreSQL connector ({POSTGRES_CONNECTOR}): only PostgreSQL is "
                          "captured here")  # fmt: skip
    for prop, value in props.items():
        if prop not in _SECRETS and _PROVIDER.search(value):
            raise ConfigError(shown, prop, f"{value!r} is a Kafka Connect config provider "
                              "reference, which only Kafka Connect resolves: write the value "
                              "in the connector file and import again")  # fmt: skip
    _check_plugin(props, shown)
    pipeline_name, name_prop = _pipeline_name(props, name, shown)
    out = Imported(pipeline_name, {})
    out.notes.extend(renamed)
    source: dict[str, Any] = {"dsn": _dsn(props, out, shown)}
    out.data = {"name": out.name, "source": source, "snapshot": {}, "target": {}, "silver": {}}
    done = set(_DSN_PROPS) | {"database.password"}
    _slot_and_publication(props, source, out)
    done |= {"slot.name", "publication.name"}
    _tables(props, source, out, shown)
    done |= {"table.include.list", "plugin.name"}
    if "plugin.name" in props:
        out.mapped.append(("plugin.name", "pgoutput, the only plug-in decoded here"))
    _name_props(props, out, name_prop, done)
    _select_overrides(props, out, done, shown)
    props = _configuration_based(props, out, done, shown)
    _carry(props, out, done, shown)
    _defaults_that_differ(props, out)
    out.data["target"] = {"root": f"${{LAKE_ROOT:-./lake}}/{out.name}"}
    out.data = {k: v for k, v in out.data.items() if v}
    return out


def _configuration_based(
    props: Mapping[str, str], out: Imported, done: set[str], shown: str
) -> Mapping[str, str]:
    """`snapshot.mode: configuration_based` as the mode its flags describe (Debezium snapshots
    at every start when snapshot.data is set, whatever is stored); flags no mode here matches are
    refused, naming the closest."""
    if props.get("snapshot.mode", "").strip().lower() != "configuration_based":
        return props
    flags = {f: _flag(props, f, shown) for f in _BASED_FLAGS}
    data, stream, on_error = (flags[f] for f in _BASED_FLAGS[:3])
    mode = _CONFIGURED_MODES.get((data, stream, on_error))
    said = (f"snapshot.data {str(data).lower()}, start.stream {str(stream).lower()}, "
            f"snapshot.on.data.error {str(on_error).lower()}")  # fmt: skip
    if mode is None:
        why = _NO_CONFIGURED_MODE.get((data, stream, on_error)) or _NO_CONFIGURED_MODE[
            (data, stream)]  # fmt: skip
        allowed = ", ".join(typing.get_args(SnapshotMode))
        raise ConfigError(shown, "snapshot.mode", f"configuration_based with {said} is {why}: "
                          f"choose one of {allowed} and import again")  # fmt: skip
    given = sorted(p for p in props if p.startswith(_BASED))
    done.update(given)
    if given:
        out.mapped.append((", ".join(given), f"snapshot.mode {mode}"))
    note = f"snapshot.mode 'configuration_based' ({said}) behaves as {mode}: written as {mode}"
    if flags["snapshot.schema"] or flags["snapshot.on.schema.error"]:
        note += ("; its schema flags have no counterpart (no schema history: every change "
                 "carries its table's columns)")  # fmt: skip
    out.notes.append(note)
    return {**props, "snapshot.mode": mode}


def _flag(props: Mapping[str, str], flag: str, shown: str) -> bool:
    text = props.get(_BASED + flag, "false").strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(shown, _BASED + flag, f"{text!r} is not true or false")
    return text == "true"


def _renamed(props: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The properties with Debezium 1.x names under their successors' names, and notes saying
    so (the successor wins when both are given)."""
    result, notes = dict(props), []
    for old, new in _LEGACY.items():
        if old in result:
            value = result.pop(old)
            result.setdefault(new, value)
            notes.append(f"{old} is Debezium 1.x's name of {new}")
    return result, notes


def _check_plugin(props: Mapping[str, str], shown: str) -> None:
    plugin = props.get("plugin.name")
    if plugin is not None and plugin.strip() != "pgoutput":
        raise ConfigError(shown, "plugin.name", f"{plugin!r}: this product decodes pgoutput "
                          "only (PostgreSQL's built-in plug-in, no server extension to "
                          "install); set plugin.name to pgoutput and import again")  # fmt: skip


def _pipeline_name(props: Mapping[str, str], name: str | None, shown: str) -> tuple[str, str]:
    """The pipeline's name and the property it comes from ("" for --name)."""
    if name is not None:
        return name, ""
    for prop in _NAME_PROPS:
        clean = re.sub(r"[^A-Za-z0-9_-]+", "_", props.get(prop, "").strip()).lstrip("_-")[:63]
        if clean:
            return clean, prop
    given = next((prop for prop in _NAME_PROPS if props.get(prop, "").strip()), None)
    if given is not None:  # only characters a name cannot hold
        raise ConfigError(shown, given, f"{props[given].strip()!r} makes no pipeline name "
                          "(letters, digits, '_' and '-'); give --name")  # fmt: skip
    raise ConfigError(shown, "topic.prefix", "no pipeline name: the file has no topic.prefix "
                      "(or database.server.name, or name); give --name")  # fmt: skip


def _name_props(props: Mapping[str, str], out: Imported, prop: str, done: set[str]) -> None:
    if not prop:  # --name: topic.prefix and the connector's name are Kafka's alone
        return
    done.add(prop)
    out.mapped.append((prop, "name"))
    if props[prop].strip() != out.name:
        out.notes.append(f"{prop} {props[prop].strip()!r} is not a pipeline name (letters, "
                         "digits, _ and -, at most 63): the pipeline is named "
                         f"{out.name}")  # fmt: skip


def _dsn(props: Mapping[str, str], out: Imported, shown: str) -> str:
    for required in ("database.hostname", "database.user", "database.dbname"):
        if not props.get(required, "").strip():
            raise ConfigError(shown, required, "required (as in Debezium) to build source.dsn")
    host = props["database.hostname"].strip()
    netloc = f"[{host}]" if ":" in host else host
    user = quote(props["database.user"].strip(), safe="")
    var = re.sub(r"[^A-Z0-9]+", "_", out.name.upper()).strip("_")
    if "database.password" in props:
        out.password_var = f"{var}_PG_PASSWORD"
        out.secret_vars.append(out.password_var)
        user += f":${{{out.password_var}}}"
    port = props.get("database.port", "5432").strip()
    if not port.isdigit():
        raise ConfigError(shown, "database.port", f"{port!r} is not a port number")
    params = [f"{p}={quote(props[d].strip(), safe='/')}" for d, p in _DSN_PARAMS.items()
              if props.get(d, "").strip()]  # fmt: skip
    if "database.sslpassword" in props:
        out.secret_vars.append(f"{var}_PG_SSLPASSWORD")
        params.append(f"sslpassword=${{{out.secret_vars[-1]}}}")
    if props.get("database.tcpKeepAlive", "true").strip().lower() == "false":
        params.append("keepalives=0")
    used = [p for p in ("database.hostname", "database.port", "database.user", "database.dbname",
                        *_DSN_PARAMS, "database.sslpassword", "database.tcpKeepAlive")
            if p in props]  # fmt: skip
    out.mapped.append((", ".join(used), "source.dsn"))
    if "database.password" in props:
        out.mapped.append(("database.password", f"${{{out.password_var}}} in source.dsn "
                           "(not written: set the variable)"))  # fmt: skip
    if "database.sslkey" in props:
        out.notes.append("database.sslkey: libpq, and the snapshot's JDBC reads with it, take "
                         "an unencrypted PKCS-8 PEM key: convert a DER .pk8 key (openssl pkcs8 "
                         "-inform DER -in KEY -out client.key, with -nocrypt if it is not "
                         "encrypted, else -passin)")  # fmt: skip
    query = f"?{'&'.join(params)}" if params else ""
    dbname = quote(props["database.dbname"].strip(), safe="")
    return f"postgresql://{user}@{netloc}:{port}/{dbname}{query}"


def _slot_and_publication(props: Mapping[str, str], source: dict[str, Any], out: Imported) -> None:
    named = (("slot.name", "slot", DEBEZIUM_SLOT),
             ("publication.name", "publication", DEBEZIUM_PUBLICATION))  # fmt: skip
    for prop, key, default in named:
        value = props.get(prop, "").strip()
        if value:
            source[key] = value
            out.mapped.append((prop, f"source.{key}"))
        else:
            source[key] = default
            out.notes.append(f"{prop} is not set: source.{key} is Debezium's default, {default}")
    if "plugin.name" not in props:
        out.notes.append("plugin.name is not set (Debezium's default is decoderbufs): the "
                         "slot must be a pgoutput one; an existing decoderbufs slot cannot be "
                         "reused")  # fmt: skip


def _tables(props: Mapping[str, str], source: dict[str, Any], out: Imported, shown: str) -> None:
    include = props.get("table.include.list", "")
    entries = split_patterns(include)
    if entries and all(_PLAIN_TABLE.fullmatch(e.strip()) for e in entries):
        source["tables"] = [e.strip().replace("\\.", ".") for e in entries]
        out.mapped.append(("table.include.list", "source.tables"))
        return
    if entries:
        source["table.include.list"] = include
        out.mapped.append(("table.include.list", "source.table.include.list"))
        out.notes.append("table.include.list holds regular expressions: each run captures the "
                         "tables it matches, found in the source's catalog")  # fmt: skip
        return
    if props.get("schema.include.list", "").strip():
        out.notes.append(
            "table.include.list is not set: each run captures the tables of the "
            "schemas schema.include.list matches, found in the source's catalog"
        )
        return
    raise ConfigError(
        shown,
        "table.include.list",
        "not set, and neither is schema.include.list: "
        "Debezium would capture every table of the database, which this product "
        "never does by default; name the tables (table.include.list) or the "
        "schemas (schema.include.list) to capture, e.g. schema.include.list=public",
    )


def _select_overrides(props: Mapping[str, str], out: Imported, done: set[str], shown: str) -> None:
    """`snapshot.select.statement.overrides` (the tables) and one
    `snapshot.select.statement.overrides.<schema>.<table>` per table (its SELECT) become
    `snapshot.select.statement.overrides`, a SELECT per table. As in Debezium, a statement for
    a table the list leaves out is not used."""
    listed = [t.strip() for t in props.get(_OVERRIDES, "").split(",") if t.strip()]
    statements = {
        prop[len(_OVERRIDES) + 1 :]: prop for prop in props if prop.startswith(f"{_OVERRIDES}.")
    }
    if not listed and not statements:
        return
    chosen = {}
    for table in listed:
        prop = statements.get(table)
        if prop is None or not props[prop].strip():
            raise ConfigError(shown, f"{_OVERRIDES}.{table}",
                              f"{_OVERRIDES} lists {table}, but {_OVERRIDES}.{table} (its "
                              "SELECT) is missing or empty")  # fmt: skip
        chosen[table] = props[prop].strip()
    if chosen:
        snapshot = out.data["snapshot"]
        assert isinstance(snapshot, dict)
        snapshot["select.statement.overrides"] = chosen
        used = ", ".join([_OVERRIDES, *(statements[t] for t in chosen)])
        out.mapped.append((used, "snapshot.select.statement.overrides"))
    unused = [prop for table, prop in statements.items() if table not in chosen]
    if unused:
        why = f"a SELECT for a table {_OVERRIDES} does not list (Debezium does not use it)"
        out.ignored.setdefault(why, []).extend(unused)
    if not chosen and _OVERRIDES in props:
        out.mapped.append((_OVERRIDES, "its default (no table)"))
    done |= {_OVERRIDES, *statements.values()}


def _carry(props: Mapping[str, str], out: Imported, done: set[str], shown: str) -> None:
    """Every other property: one-to-one, a conversion, ignored, unsupported or unknown."""
    targets = mapped_properties()
    converters = [c.strip() for c in props.get("converters", "").split(",") if c.strip()]
    for prop, value in props.items():
        if prop in done:
            continue
        if prop in targets:
            target = targets[prop]
            section = out.data.setdefault(target.section, {})
            assert isinstance(section, dict)
            text = _channels(prop, value, out) if prop in _CHANNEL_PROPS else value
            if text.strip():
                section[target.key] = _value(prop, text, target, out, shown)
            out.mapped.append((prop, target.path if text.strip() else "its default"))
        elif _TRANSFORM.fullmatch(prop):
            source = out.data["source"]
            assert isinstance(source, dict)
            source.setdefault("column.transforms", {})[prop] = value
            out.mapped.append((prop, f"source.column.transforms.{prop}"))
        elif (reason := _kafka_reason(prop)) is not None:
            out.ignored.setdefault(reason, []).append(prop)
        elif prop in UNSUPPORTED or prop.startswith(_UNSUPPORTED_PREFIXES):
            out.unsupported.append((prop, UNSUPPORTED.get(prop, "")))
        elif any(prop.startswith(f"{c}.") for c in converters):
            out.unsupported.append((prop, "a setting of a custom converter (converters)"))
        else:
            known = [*targets, *UNSUPPORTED, *_DSN_PROPS, *_CONVERTED, *_LEGACY, "plugin.name",
                     "slot.name", "publication.name", "topic.prefix", "database.server.name",
                     *(n for _, names, _ in KAFKA_GROUPS for n in names)]  # fmt: skip
            out.unknown.append((prop, suggest(prop, known).strip()))


def _defaults_that_differ(props: Mapping[str, str], out: Imported) -> None:
    """A note naming the unset properties whose default here is not Debezium's."""
    targets = mapped_properties()
    differ = []
    for prop, debezium_default in _DEBEZIUM_DEFAULTS.items():
        target = targets[prop]
        cls = typing.get_type_hints(PipelineConfig)[target.section]
        ours = next(f.default for f in dataclasses.fields(cls) if yaml_key(f) == target.key)
        if prop not in props and str(ours) != debezium_default:
            differ.append(f"{prop} (Debezium {debezium_default}, here {ours})")
    if differ:
        out.notes.append("unset properties whose default here differs from Debezium's (set them "
                         f"to keep Debezium's behaviour): {'; '.join(differ)}")  # fmt: skip


def _channels(prop: str, value: str, out: Imported) -> str:
    """Signal or notification channels without Debezium's Kafka and JMX ones, which need
    Kafka or a JVM (the loader refuses them); a note says which were dropped."""
    items = [i.strip() for i in value.split(",") if i.strip()]
    kept = [i for i in items if i.lower() not in ("kafka", "jmx")]
    if len(kept) < len(items):
        dropped = ", ".join(i for i in items if i not in kept)
        left = ", ".join(kept) or ("none" if prop.startswith("notification") else "the default")
        out.notes.append(f"{prop}: {dropped} dropped (Kafka's, or a JVM's); left: {left}")
    return ",".join(kept)


def _kafka_reason(prop: str) -> str | None:
    for reason, names, prefixes in KAFKA_GROUPS:
        if prop in names or prop.startswith(prefixes):
            return reason
    return None


def _value(prop: str, value: str, target: Target, out: Imported, shown: str) -> Any:
    """A property's text as the YAML value of its key: numbers and booleans typed, milliseconds
    as seconds, snapshot modes renamed, `$` kept literal (the loader reads `${VAR}` and `$$`)."""
    text = value.strip()
    if prop == "snapshot.mode":
        return _snapshot_mode(text, out, shown)
    if prop in _MILLISECONDS and re.fullmatch(r"-?\d+", text):
        if int(text) < 0:
            raise ConfigError(shown, prop, f"{text} is negative: give the milliseconds, or 0 "
                              "for no limit (as Debezium takes it)")  # fmt: skip
        seconds = int(text) / 1000
        return int(seconds) if seconds.is_integer() else seconds
    if target.tp is int and re.fullmatch(r"-?\d+", text):
        return int(text)
    if target.tp is bool and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return re.sub(r"\$(?=[${])", "$$", value)


def _snapshot_mode(text: str, out: Imported, shown: str) -> str:
    """Debezium's mode as the loader takes it: its deprecated values (the field's aliases) and
    the older names renamed; a mode with no counterpart is refused."""
    mode = next(f for f in dataclasses.fields(SnapshotConfig) if f.name == "mode")
    aliases = {**mode.metadata.get("aliases", {}), **_LEGACY_SNAPSHOT_MODES}
    folded = text.lower()  # Debezium parses its modes in any case
    if folded in aliases:
        out.notes.append(f"snapshot.mode {text!r} is deprecated or renamed in Debezium: "
                         f"written as {aliases[folded]}")  # fmt: skip
        return str(aliases[folded])
    allowed = typing.get_args(SnapshotMode)
    if folded in ("custom", "recovery", "schema_only_recovery"):
        raise ConfigError(shown, "snapshot.mode", f"{text!r} has no counterpart here: choose "
                          f"one of {', '.join(allowed)} and import again")  # fmt: skip
    return folded if folded in allowed else text
