"""The configuration reference (`docs/configuration.md`), generated from the dataclasses the
loader builds, so it lists exactly the keys the loader accepts.

    python -m cdc_core.config.reference > docs/configuration.md

`tests/unit/test_config_reference.py` fails when the checked-in file is stale.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from cdc_core.config.loader import yaml_key
from cdc_core.config.model import EnvConfig, PipelineConfig

_HEADER = """\
# Configuration reference

Generated from `cdc_core/config/model.py` by `python -m cdc_core.config.reference`; do not
edit by hand (`tests/unit/test_config_reference.py` fails when this file is stale).

A pipeline file `pipelines/NAME.yaml` says what is captured; an environment file
`conf/ENV.yaml` says where and how it runs. Keys are nested as the dotted paths below show
(`snapshot.chunk.size` is `chunk.size:` under `snapshot:`). Any value may use `${VAR}` or
`${VAR:-default}`. Unknown keys, bad values and missing required keys stop the run at load
time with the file, the key and the fix named.
"""


def render() -> str:
    """The whole reference as Markdown."""
    parts = [_HEADER]
    for title, cls in (("Pipeline file", PipelineConfig), ("Environment file", EnvConfig)):
        parts.append(f"\n## {title}: `{_file_of(cls)}`\n")
        for section, rows in _sections(cls):
            if not rows:
                continue
            parts.append(f"\n### `{section or '(top level)'}`\n")
            doc = _doc_line(cls if not section else _section_class(cls, section))
            if doc:
                parts.append(f"\n{doc}\n")
            parts.append(
                "\n| key | type | default | meaning | Debezium property |\n|---|---|---|---|---|\n"
            )
            parts.extend(
                f"| `{key}` | {kind} | {default} | {doc} | {debezium} |\n"
                for key, kind, default, doc, debezium in rows
            )
    return "".join(parts)


def keys() -> list[str]:
    """Every dotted key the loader accepts, pipeline and environment files together."""
    return [
        f"{section}.{row[0]}" if section else row[0]
        for cls in (PipelineConfig, EnvConfig)
        for section, rows in _sections(cls)
        for row in rows
    ]


def _file_of(cls: type[Any]) -> str:
    return "pipelines/NAME.yaml" if cls is PipelineConfig else "conf/ENV.yaml"


def _sections(cls: type[Any]) -> Iterator[tuple[str, list[tuple[str, str, str, str, str]]]]:
    """(dotted section, rows) for `cls` and every nested section, depth first."""
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if _is_section(tp):
            nested.append((yaml_key(f), tp))
            continue
        item = _list_item(tp)
        if item is not None:  # a list of entries: a row here, the entries' keys under key[]
            nested.append((f"{yaml_key(f)}[]", item))
        rows.append(_row(f, tp))
    yield "", rows
    for key, tp in nested:
        for section, sub in _sections(typing.cast("type[Any]", tp)):
            yield (f"{key}.{section}" if section else key), sub


def _section_class(cls: type[Any], section: str) -> type[Any]:
    for part in section.split("."):
        hints = typing.get_type_hints(cls)
        key = part.removesuffix("[]")
        tp = next(hints[f.name] for f in dataclasses.fields(cls) if yaml_key(f) == key)
        cls = _list_item(tp) or tp if part.endswith("[]") else tp
    return cls


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp) and not hasattr(tp, "parse")


def _list_item(tp: Any) -> type[Any] | None:
    """The entry class of a list of mappings (`tuple[SomeDataclass, ...]`), else None."""
    if get_origin(tp) is tuple and _is_section(get_args(tp)[0]):
        return typing.cast("type[Any]", get_args(tp)[0])
    return None


def _doc_line(cls: type[Any]) -> str:
    return " ".join((cls.__doc__ or "").split())


def _row(f: dataclasses.Field[Any], tp: Any) -> tuple[str, str, str, str, str]:
    doc = str(f.metadata.get("doc", "")).replace("|", "\\|")
    aliases = f.metadata.get("aliases") or {}
    if aliases:
        doc += " (deprecated aliases: " + ", ".join(f"`{a}` = `{v}`" for a, v in aliases.items())
        doc += ")"
    debezium = f.metadata.get("debezium")
    return (
        yaml_key(f),
        _type_name(tp),
        _default(f),
        doc,
        ", ".join(f"`{d.strip()}`" for d in debezium.split(",")) if debezium else "",
    )


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return _type_name(options[0]) + " (optional)"
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(tp))
    if origin is tuple:
        if _list_item(tp) is not None:
            return "list of entries (below)"
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin in (dict, Mapping, typing.Mapping) or tp is dict:
        return "mapping of text"
    name = getattr(tp, "__name__", str(tp))
    return {
        "str": "text",
        "int": "whole number",
        "float": "number",
        "bool": "true \\| false",
        "TableName": "schema.table",
        "Dsn": "connection string",
        "ByteSize": "size (bytes, or 64MiB, 1GB, ...)",
    }.get(name, f"`{getattr(tp, 'type_name', name)}`")


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "**required**"
    factory = typing.cast("typing.Callable[[], object]", f.default_factory)
    value = f.default if f.default is not dataclasses.MISSING else factory()
    if not value and not isinstance(value, bool | int | float):
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`" + ", ".join(str(v) for v in value) + "`"
    return f"`{value}`"


if __name__ == "__main__":
    print(render(), end="")
