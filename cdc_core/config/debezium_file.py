"""`cdc import-debezium`: a Debezium connector file (Kafka Connect JSON or `.properties`) in,
a pipeline file out, checked with the product's own loader before it is written."""

from __future__ import annotations

import dataclasses
import json
import os
import string
import tempfile
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

from cdc_core.config import load_pipeline, project_home
from cdc_core.config.debezium import Imported, translate
from cdc_core.config.loader import display_path, yaml_key
from cdc_core.config.model import PipelineConfig
from cdc_core.errors import ConfigError, UsageError

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def import_connector(file: Path, name: str | None, output: Path | None, force: bool) -> str:
    """Translate, check and write; returns the report to print."""
    shown = display_path(file)
    imported = translate(read_connector(file, shown), shown, name)
    path = output or project_home() / "pipelines" / f"{imported.name}.yaml"
    out_shown = display_path(path)
    if path.stem != imported.name or path.suffix not in (".yaml", ".yml"):
        raise UsageError(f"cdc import-debezium: --output {out_shown}: the loader reads pipeline "
                         f"{imported.name} from {imported.name}.yaml; name the file so, or "
                         "give --name")  # fmt: skip
    if path.exists() and not force:
        raise UsageError(f"cdc import-debezium: {out_shown} exists; --force replaces it")
    text = render(imported, shown)
    check_loads(imported, text, shown)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
    return format_report(imported, out_shown)


def read_connector(file: Path, shown: str) -> dict[str, str]:
    """The connector's properties: `{"name": ..., "config": {...}}`, the bare `config` object,
    or a Java `.properties` file."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8"
        raise ConfigError(shown, None, f"cannot read the file: {why}") from e
    if file.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        return _from_json(text, shown)
    try:
        return parse_properties(text)
    except ValueError as e:
        raise ConfigError(shown, None, str(e)) from e


def _from_json(text: str, shown: str) -> dict[str, str]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        twice = next((k for k in keys if keys.count(k) > 1), None)
        if twice is not None:
            raise ConfigError(shown, twice, "given twice")
        return dict(pairs)

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{shown}:{e.lineno}:{e.colno}", None, f"malformed JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise ConfigError(shown, None, "expected a JSON object of connector properties")
    if isinstance(data.get("config"), dict):  # what Kafka Connect's REST API is POSTed
        config = dict(data["config"])
        if isinstance(data.get("name"), str):
            config.setdefault("name", data["name"])
        data = config
    props = {}
    for key, value in data.items():
        if not isinstance(value, str | int | float):  # bool is an int
            raise ConfigError(shown, key, f"expected a single value, got {json.dumps(value)}")
        props[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return props


def parse_properties(text: str) -> dict[str, str]:
    """A Java `.properties` file as `java.util.Properties.load` reads it: `#`/`!` comments,
    `=`, `:` or blanks between key and value, `\\` continuing a line, `\\uXXXX` and `\\t`
    escapes; any other escaped character is itself (so `public\\\\.orders` is `public\\.orders`)."""
    props: dict[str, str] = {}
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.lstrip()
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1] + next(lines, "").lstrip()
        key, value = _split_entry(line)
        props[_unescape(key)] = _unescape(value)
    return props


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        if line[i] in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "u":  # exactly four hex digits, or Java refuses the file
                digits = text[i + 2 : i + 6]
                if len(digits) < 4 or any(d not in string.hexdigits for d in digits):
                    raise ValueError(f"malformed escape {text[i : i + 6]!r}: four hex "
                                     "digits follow \\u, as Java reads .properties")  # fmt: skip
                out.append(chr(int(digits, 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


class _Dumper(yaml.SafeDumper):
    """Lists of names in flow style (`tables: [a, b]`, as the README writes them), mappings
    as blocks."""


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


_Dumper.add_representer(list, _list)


def render(imported: Imported, shown: str) -> str:
    """The pipeline file: a header saying where it came from and what was left out, then the
    keys in the README's order (name, source, snapshot, target, silver), each section in the
    order of its fields."""
    header = [f"# Imported from {shown} by `cdc import-debezium`."]
    if imported.secret_vars:
        header.append(f"# Passwords are not written here: set {', '.join(imported.secret_vars)}.")
    left = [("ignored (Kafka)", [p for ps in imported.ignored.values() for p in ps]),
            ("not supported", [p for p, _ in imported.unsupported]),
            ("unknown", [p for p, _ in imported.unknown])]  # fmt: skip
    if any(props for _, props in left):
        header.append("# Not carried over (see the import's output for why):")
        for kind, props in left:
            if props:
                header.extend(_comment(f"{kind}: {', '.join(props)}", "#   ", "#     "))
    for note in imported.notes:
        header.extend(_comment(f"Note: {note}", "# ", "#   "))
    order = ("name", "source", "snapshot", "target", "silver")  # then any other section
    keys = [*order, *(k for k in imported.data if k not in order)]
    data = {k: _ordered(k, imported.data[k]) for k in keys if k in imported.data}
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(header) + "\n" + body


def _comment(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)  # fmt: skip


def _ordered(section: str, value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    cls = typing.get_type_hints(PipelineConfig)[section]
    keys = [yaml_key(f) for f in dataclasses.fields(cls)]
    return dict(sorted(value.items(), key=lambda kv: keys.index(kv[0])))


def check_loads(imported: Imported, text: str, shown: str) -> None:
    """Load `text` with the product's loader (`load_pipeline`); a problem is a `ConfigError`
    naming the Debezium property it came from."""
    _raise(_load(imported, text), imported, shown)


def _load(imported: Imported, text: str) -> ConfigError | None:
    environ = dict.fromkeys(imported.secret_vars, "set-when-the-pipeline-runs")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "conf").mkdir()
        (home / "conf" / "local.yaml").write_text("spark: {}\n", encoding="utf-8")
        path = home / f"{imported.name}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_pipeline(str(path), "local", home=home, environ=environ)
        except ConfigError as e:
            return e
    return None


def _raise(problem: ConfigError | None, imported: Imported, shown: str) -> None:
    if problem is None:
        return
    origin = {where.split()[0]: props for props, where in imported.mapped}
    key = problem.key or ""
    prop = next((origin[k] for k in sorted(origin, key=len, reverse=True)
                 if key == k or key.startswith(f"{k}.")), None)  # fmt: skip
    if prop is None and key == "name":
        raise UsageError(f"cdc import-debezium: --name {imported.name!r}: {problem.message}")
    where = f" (as {key} of the pipeline file)" if key else ""
    raise ConfigError(shown, prop or key or None, f"{problem.message}{where}") from problem


def format_report(imported: Imported, out_shown: str) -> str:
    """What was written and what became of every property; the counts last."""
    lines = [f"wrote {out_shown} (pipeline {imported.name})", "mapped:"]
    lines.extend(f"  {props} -> {where}" for props, where in imported.mapped)
    if imported.ignored:
        lines.append("ignored (Kafka, Kafka Connect, JVM):")
        for reason, props in imported.ignored.items():
            lines.append(f"  {', '.join(props)}: {reason}")
    if imported.unsupported:
        lines.append("not supported:")
        lines.extend(f"  {p}{': ' + hint if hint else ''}" for p, hint in imported.unsupported)
    if imported.unknown:
        lines.append("unknown (not a Debezium PostgreSQL property: a typo?):")
        lines.extend(f"  {p}{' ' + hint if hint else ''}" for p, hint in imported.unknown)
    lines.extend(f"note: {note}" for note in imported.notes)
    if imported.password_var:
        lines.append(f"set {imported.password_var} to the database password before a run (or "
                     "use source.password_file: README, Permissions)")  # fmt: skip
    for var in imported.secret_vars:
        if var != imported.password_var:
            lines.append(f"set {var} to the password of the SSL key (database.sslpassword)")
    ignored = sum(len(p) for p in imported.ignored.values())
    lines.append(f"mapped {imported.mapped_count}, ignored (Kafka) {ignored}, unsupported "
                 f"{len(imported.unsupported)}, unknown {len(imported.unknown)}")  # fmt: skip
    return "\n".join(lines)
