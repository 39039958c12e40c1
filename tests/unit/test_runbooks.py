"""docs/runbooks.md stays honest: every command line in its code blocks parses with the
product's own argument parsers, and every configuration key it names (and every YAML block it
shows) is one the loader accepts."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from cdc_core import cli
from cdc_core.config import load_pipeline
from cdc_core.config.reference import keys

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "runbooks.md"
PIPELINE = {
    "name": "orders",
    "source": {
        "dsn": "postgresql://cdc_lake@127.0.0.1:5432/shop",
        "slot": "orders_cdc",
        "publication": "orders_cdc",
        "tables": ["public.orders"],
    },
    "target": {"root": "/tmp/lake"},
}
_FENCE = re.compile(r"^\s*```(\w*)\s*$")
_COMMAND = re.compile(r"^(cdc|spark-submit|python)\s")
_INLINE = re.compile(r"`([^`\n]+)`")
_SECTIONS = sorted({k.split(".")[0] for k in keys() if "." in k})
_KEY = re.compile(rf"^(?:{'|'.join(_SECTIONS)})\.[A-Za-z0-9_.]+$")
_FILE = re.compile(r"\.(json|jsonl|yaml|md|prom|py|lock|txt)$")  # `catalog.json`: a file of _state


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced code block; list items' indentation removed."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    lang = ""
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence and current is None:
            lang, current = fence.group(1), []
        elif fence:
            assert current is not None
            blocks.append((lang, current))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "an unclosed code block"
    return [(lang, _dedent(lines)) for lang, lines in blocks]


def _dedent(lines: list[str]) -> list[str]:
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[indent:] for x in lines]


def _prose(text: str) -> str:
    """The text outside code blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append(line)
    return "\n".join(out)


def _is_command(line: str) -> bool:
    return bool(_COMMAND.match(line)) and (line.startswith("cdc ") or " jobs/" in line)


def commands() -> list[str]:
    """Every command line in a code block: `cdc ...`, `spark-submit jobs/...`, `python jobs/...`;
    and the prose's inline ones that name a pipeline."""
    text = DOC.read_text()
    found = [x.strip() for _, lines in _blocks(text) for x in lines if _is_command(x.strip())]
    inline = [s for s in _INLINE.findall(_prose(text)) if _is_command(s) and "--pipeline" in s]
    return found + inline


def _parser_of(job: str) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser `jobs/JOB.py` runs its arguments through, and what it puts before them."""
    assert (ROOT / "jobs" / f"{job}.py").is_file(), f"jobs/{job}.py does not exist"
    module = importlib.import_module(f"cdc_core.jobs.{job}")
    build = getattr(module, "build_parser", None)
    if build is not None:
        parser: argparse.ArgumentParser = build()
        return parser, []
    return cli.build_parser(), [job]  # jobs/validate.py is `cdc validate` as a file


def _parse(line: str) -> argparse.Namespace:
    argv = shlex.split(line, comments=True)
    prefix: list[str] = []
    if argv[0] == "cdc":
        parser, args = cli.build_parser(), argv[1:]
    else:
        script = next(i for i, a in enumerate(argv) if a.startswith("jobs/"))
        parser, prefix = _parser_of(Path(argv[script]).stem)
        args = argv[script + 1 :]
    _exact(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args([*prefix, *args])
    except SystemExit:
        pytest.fail(f"docs/runbooks.md: {line!r} does not parse: {err.getvalue().strip()}")


def _exact(parser: argparse.ArgumentParser) -> None:
    """No abbreviated options (`--pipelin`): what users copy must be the option's whole name."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _exact(sub)


def test_the_runbooks_show_commands_of_every_kind() -> None:
    found = commands()
    assert any(c.startswith("cdc snapshot ") for c in found)
    assert any(c.startswith("spark-submit jobs/ingest.py ") for c in found)
    assert any(c.startswith("python jobs/ingest.py ") for c in found)
    assert len(found) >= 15


@pytest.mark.parametrize("line", commands())
def test_every_command_line_parses_with_the_real_parser(line: str) -> None:
    args = _parse(line)
    assert args.pipeline == "orders"


def config_spans() -> list[str]:
    """Inline code in the prose that names a configuration key: `snapshot.mode` or
    `snapshot.mode: when_needed`."""
    spans = []
    for span in _INLINE.findall(_prose(DOC.read_text())):
        key = span.split(":", 1)[0].strip()
        if _KEY.match(key) and not _FILE.search(key):
            spans.append(span)
    return spans


def test_the_runbooks_name_configuration_keys() -> None:
    names = {s.split(":", 1)[0] for s in config_spans()}
    assert {"snapshot.mode", "source.dsn", "source.retained_wal_fail", "target.root"} <= names


@pytest.mark.parametrize("span", config_spans())
def test_every_configuration_key_named_exists(span: str, tmp_path: Path) -> None:
    key, _, value = (part.strip() for part in span.partition(":"))
    assert key in keys(), f"docs/runbooks.md names `{key}`, which is no configuration key"
    if value and key.split(".")[0] not in ("spark", "catalog"):  # a pipeline key with a value
        section, _, rest = key.partition(".")
        _load(tmp_path, {section: {rest: yaml.safe_load(value)}})


def yaml_blocks() -> list[str]:
    return ["\n".join(lines) for lang, lines in _blocks(DOC.read_text()) if lang == "yaml"]


@pytest.mark.parametrize("block", yaml_blocks())
def test_every_yaml_block_loads_in_a_pipeline_file(block: str, tmp_path: Path) -> None:
    _load(tmp_path, yaml.safe_load(block))


def _load(home: Path, extra: dict[str, dict[str, object]]) -> None:
    """Load the pipeline `orders` with `extra`'s sections merged in: unknown keys or bad values
    raise ConfigError."""
    pipeline = {k: dict(v) if isinstance(v, dict) else v for k, v in PIPELINE.items()}
    for section, values in extra.items():
        merged = pipeline.setdefault(section, {})
        assert isinstance(merged, dict)
        merged.update(values)
    (home / "pipelines").mkdir(exist_ok=True)
    (home / "conf").mkdir(exist_ok=True)
    (home / "pipelines" / "orders.yaml").write_text(yaml.safe_dump(pipeline))
    (home / "conf" / "local.yaml").write_text("{}\n")
    load_pipeline("orders", "local", home=home, environ={})
