"""Typed loading of YAML into frozen dataclasses: interpolation, validation, errors with fixes.

The dataclasses in `model.py` describe every key; this module knows nothing about pipelines.
Field metadata (built by `meta`) carries the one-line doc, the YAML key when it differs from
the field name (Debezium's dotted names), deprecated aliases of values and an example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import math
import os
import re
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from cdc_core.errors import ConfigError

log = logging.getLogger("cdc_core.config")

Placer = Callable[[str, int, int, str], str]  # (text, start, end, value) -> what goes there
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}|\$\{")
ENV_VALUE = "\x1a"  # stands for a value the environment supplied (see `Builder.interpolate`)


class FieldError(ValueError):
    """Raised by a config dataclass's `__post_init__` to reject the value of one of its keys."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def meta(
    doc: str,
    *,
    key: str | None = None,
    debezium: str | None = None,
    example: str | None = None,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Metadata for a config field: its doc line and how it appears in YAML."""
    return {
        "doc": doc,
        "key": key,
        "debezium": debezium,
        "example": example,
        "aliases": dict(aliases or {}),
    }


def yaml_key(f: dataclasses.Field[Any]) -> str:
    """The key a field is written under in YAML."""
    key = f.metadata.get("key")
    return key if isinstance(key, str) else f.name


def display_path(path: Path, home: Path | None = None) -> str:
    """A path as the user would type it: relative to the project home or working directory."""
    for base in (home, Path.cwd()):
        if base is None:
            continue
        try:
            return str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # `<<: *defaults`: the mapping's own keys win
            continue
        key = loader.construct_object(key_node, deep=True)
        mark = key_node.start_mark
        if not isinstance(key, Hashable):
            problem = f"a key is a single value, not {_kind(key)}"
            raise yaml.constructor.ConstructorError(None, None, problem, mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        seen[key] = key_node
    return loader.construct_mapping(node, deep=True)


_MERGE_TAG = "tag:yaml.org,2002:merge"


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


class _WrittenInt(int):
    """A YAML integer that remembers how the file wrote it: a key that takes text gets that
    text (`slot: 0755` is the slot '0755', not '493', the octal number YAML reads)."""

    written: str


class _WrittenFloat(float):
    """A YAML float that remembers how the file wrote it (`_WrittenInt`)."""

    written: str


def _written_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    number = _WrittenInt(yaml.SafeLoader.construct_yaml_int(loader, node))
    number.written = str(node.value)
    return number


def _written_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float:
    number = _WrittenFloat(yaml.SafeLoader.construct_yaml_float(loader, node))
    number.written = str(node.value)
    return number


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _written_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _written_float)


def _text_of(number: int | float) -> str:
    """A number as the file wrote it, where it is one a key that takes text was given."""
    return str(getattr(number, "written", number))


def read_yaml(path: Path, shown: str) -> dict[str, Any]:
    """Parse one YAML file whose top level is a mapping; errors name `shown`, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(shown, None, f"cannot read the file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(shown, None, f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at "
                          f"offset {e.start} (save the file as UTF-8)") from e  # fmt: skip
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except RecursionError as e:
        raise ConfigError(shown, None, "malformed YAML: nested too deep") from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        problem = e.problem or e.context or "cannot parse"
        raise ConfigError(where, None, f"malformed YAML: {problem}") from e
    except yaml.YAMLError as e:
        raise ConfigError(shown, None, f"malformed YAML: {e}") from e
    if data is None:
        raise ConfigError(shown, None, "the file is empty: it must hold a mapping of keys")
    if not isinstance(data, dict):
        # never its text: a file given by mistake (a secrets file for --env) may hold secrets
        kind = "a list" if isinstance(data, list) else "a single value"
        raise ConfigError(shown, None, f"the top level must be a mapping of keys, not {kind} "
                          "(is it the right file?)")  # fmt: skip
    return data


def suggest(word: str, choices: typing.Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    kind = next(t for t in type(value).__mro__ if not t.__name__.startswith("_"))
    return f"{kind.__name__} {value!r}"  # the YAML number's own type, not the loader's


class Builder:
    """Builds one dataclass tree from one file's data, with the file named in every error."""

    def __init__(self, file: str, env: Mapping[str, str] | None = None) -> None:
        self.file = file
        self.env = os.environ if env is None else env

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(self.file, path or None, message)

    def interpolate(
        self, text: str, path: str, *, written: bool = False, place: Placer | None = None
    ) -> str:
        """Replace `${VAR}` and `${VAR:-default}` from the environment; `$$` is a literal `$`.
        `written`: put `ENV_VALUE` where the environment supplies a value, which leaves what the
        file itself writes (defaults included). `place`: how the value's type holds a value
        from the environment at a place in its text (`Dsn.substituted`)."""
        masked = _VAR.sub(lambda m: "x" * len(m.group(0)), text)

        def replace(m: re.Match[str]) -> str:
            whole, var, has_default, default = m.group(0), m.group(1), m.group(2), m.group(3)
            if whole == "$$":
                return "$"
            if var is None:
                raise self.error(path, f"unterminated or malformed '${{' in {text!r}")
            if has_default and "${" in default:  # its `}` ended this one: text would remain
                raise self.error(path, f"the default of ${{{var}}} holds another '${{...}}' in "
                                 f"{text!r}: defaults are plain text, not nested")  # fmt: skip
            value = self.env.get(var)
            if value is not None and (value != "" or not has_default):
                if written:
                    return ENV_VALUE
                return place(masked, m.start(), m.end(), value) if place else value
            if has_default:
                return str(default)
            raise self.error(
                path,
                f"${{{var}}} is not set and has no default "
                f"(export {var}=... or write ${{{var}:-default}})",
            )

        return _VAR.sub(replace, text)

    def build(self, cls: type[Any], data: Mapping[str, Any], path: str = "") -> Any:
        """Instantiate dataclass `cls` from `data`, validating every key and value."""
        fields = {yaml_key(f): f for f in dataclasses.fields(cls) if f.init}
        hints = typing.get_type_hints(cls)
        for key in data:
            if str(key) not in fields:
                valid = ", ".join(sorted(fields))
                raise self.error(
                    _join(path, str(key)),
                    f"unknown key{suggest(str(key), fields)}; valid keys here: {valid}",
                )
        kwargs: dict[str, Any] = {}
        for key, f in fields.items():
            sub = _join(path, key)
            if key in data:
                kwargs[f.name] = self.value(hints[f.name], data[key], sub, f)
            elif _required(f):
                tp: type[Any] = hints[f.name]
                if dataclasses.is_dataclass(tp) and not any(map(_required, dataclasses.fields(tp))):
                    kwargs[f.name] = self.build(tp, {}, sub)  # a section of defaults only
                    continue
                example = f.metadata.get("example")
                hint = f" (add it, for example {key}: {example})" if example else ""
                raise self.error(sub, f"required key is missing{hint}")
        try:
            return cls(**kwargs)
        except FieldError as e:  # checks in __post_init__ name the key they reject
            raise self.error(_join(path, e.key), str(e)) from e
        except ValueError as e:
            raise self.error(path, str(e)) from e

    def value(self, tp: Any, raw: Any, path: str, f: dataclasses.Field[Any] | None) -> Any:
        """Convert one raw YAML value to type `tp`."""
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):  # before interpolating: the value is read once
            options = [a for a in get_args(tp) if a is not type(None)]
            if raw is None:
                return None
            return self.value(options[0], raw, path, f)
        if isinstance(raw, str):
            check: Callable[[str], str | None] | None = getattr(tp, "check_written", None)
            problem = check(self.interpolate(raw, path, written=True)) if check else None
            if problem:  # e.g. a password in clear: it must come from the environment
                raise self.error(path, problem)
            raw = self.interpolate(raw, path, place=getattr(tp, "substituted", None))
        if origin is Literal:
            return self._literal(tp, raw, path, f)
        if dataclasses.is_dataclass(tp) and not hasattr(tp, "parse"):
            if not isinstance(raw, dict):
                raise self.error(path, f"expected a mapping of keys, got {_kind(raw)}")
            return self.build(typing.cast("type[Any]", tp), raw, path)
        if origin is tuple:
            if not isinstance(raw, list):
                raise self.error(path, f"expected a list, got {_kind(raw)}")
            item = get_args(tp)[0]
            return tuple(self.value(item, v, f"{path}[{i}]", f) for i, v in enumerate(raw))
        if origin in (dict, Mapping, typing.Mapping) or tp is dict:
            if not isinstance(raw, dict):
                raise self.error(path, f"expected a mapping, got {_kind(raw)}")
            return types.MappingProxyType(
                {str(k): self._scalar_text(v, _join(path, str(k))) for k, v in raw.items()}
            )
        return self._scalar(tp, raw, path)

    def _literal(self, tp: Any, raw: Any, path: str, f: dataclasses.Field[Any] | None) -> Any:
        allowed = [str(a) for a in get_args(tp)]
        aliases: dict[str, str] = dict(f.metadata.get("aliases", {})) if f else {}
        text = str(raw).strip() if isinstance(raw, str | int) else None
        # in any case, as Debezium parses its enumerated values (equalsIgnoreCase)
        folded = {a.lower(): a for a in [*allowed, *aliases]}.get((text or "").lower())
        if folded in aliases:
            log.warning("%s: %s: %r is deprecated, use %r", self.file, path, text, aliases[folded])
            return aliases[folded]
        if folded in allowed:
            return folded
        if raw is None or isinstance(raw, list | dict):
            raise self.error(path, f"expected one of {', '.join(allowed)}, got {_kind(raw)}")
        raise self.error(
            path,
            f"{raw!r} is not one of {', '.join(allowed)}{suggest(str(raw), allowed)}",
        )

    def _scalar_text(self, raw: Any, path: str) -> str:
        if isinstance(raw, str):
            return self.interpolate(raw, path)
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, int | float):
            return _text_of(raw)
        raise self.error(path, f"expected a single value, got {_kind(raw)}")

    def _scalar(self, tp: Any, raw: Any, path: str) -> Any:
        if tp is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
                return raw.strip().lower() == "true"
            raise self.error(path, f"expected true or false, got {_kind(raw)}")
        if tp in (int, float):
            return self._number(tp, raw, path)
        if tp is str:
            if isinstance(raw, str):
                return raw
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                return _text_of(raw)
            raise self.error(path, f"expected a string, got {_kind(raw)}")
        return self._parsed(tp, raw, path)

    def _parsed(self, tp: Any, raw: Any, path: str) -> Any:
        """A value of a type with `parse(text)` (and `from_items(list)` for YAML lists)."""
        parse: Callable[[str], Any] | None = getattr(tp, "parse", None)
        from_items: Callable[[list[str]], Any] | None = getattr(tp, "from_items", None)
        if from_items is not None and isinstance(raw, list):  # a YAML list of its items
            items = [self._scalar_text(v, f"{path}[{i}]") for i, v in enumerate(raw)]
            try:
                return from_items(items)
            except ValueError as e:
                raise self.error(path, str(e)) from e
        if parse is not None:
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                raw = str(raw)
            if not isinstance(raw, str):
                raise self.error(path, f"expected a string, got {_kind(raw)}")
            try:
                return parse(raw)
            except ValueError as e:
                raise self.error(path, str(e)) from e
        raise TypeError(f"config type {tp!r} at {path} is not supported by the loader")

    def _number(self, tp: type[int] | type[float], raw: Any, path: str) -> int | float:
        if isinstance(raw, bool):
            raise self.error(path, f"expected a number, got {_kind(raw)}")
        number: int | float | None = None
        try:
            if isinstance(raw, int) or (tp is float and isinstance(raw, float)):
                number = tp(raw)
            elif isinstance(raw, str):
                with contextlib.suppress(ValueError):
                    number = tp(raw.strip())
        except OverflowError as e:  # a whole number too big for a float
            raise self.error(path, f"expected a finite number, got one of {len(str(raw))} "
                             "digits") from e  # fmt: skip
        if number is not None:
            if not math.isfinite(number):  # .nan, .inf, "1e999"
                raise self.error(path, f"expected a finite number, got {raw!r}")
            return number
        kind = "a whole number" if tp is int else "a number"
        raise self.error(path, f"expected {kind}, got {_kind(raw)}")


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
