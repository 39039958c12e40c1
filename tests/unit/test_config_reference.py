"""docs/configuration.md is generated from the configuration code: complete and current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdc_core.config import load_env, load_pipeline
from cdc_core.config.reference import render
from cdc_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
PIPELINE = """\
name: orders
source:
  dsn: postgresql://postgres@127.0.0.1:5432/shop
  slot: orders_cdc
  publication: orders_cdc
  tables: [public.orders]
target:
  root: /tmp/lake
"""
SECTIONS = ["", "source", "target", "snapshot", "capture", "silver", "maintenance", "validate"]
ENV_SECTIONS = ["spark", "catalog"]  # the top level holds only sections


def test_the_checked_in_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run python -m cdc_core.config.reference "
        "> docs/configuration.md"
    )


def _valid_keys(tmp_path: Path, section: str, *, env: bool) -> list[str]:
    """The keys the loader itself lists as valid in a section (probed with an unknown key)."""
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    (tmp_path / "conf").mkdir(exist_ok=True)
    pipeline, conf = PIPELINE, "{}\n"
    probe = "zz_not_a_key: 1\n"
    if env:
        conf = probe if not section else f"{section}:\n  {probe}"
    elif not section:
        pipeline += probe
    elif section in ("source", "target"):
        pipeline = pipeline.replace(f"{section}:\n", f"{section}:\n  {probe}")
    else:
        pipeline += f"{section}:\n  {probe}"
    (tmp_path / "pipelines" / "orders.yaml").write_text(pipeline)
    (tmp_path / "conf" / "local.yaml").write_text(conf)

    def load() -> object:
        if env:
            return load_env("local", home=tmp_path, environ={})
        return load_pipeline("orders", "local", home=tmp_path, environ={})

    with pytest.raises(ConfigError) as e:
        load()
    found = re.search(r"valid keys here: (.*)$", str(e.value))
    assert found, str(e.value)
    return found.group(1).split(", ")


@pytest.mark.parametrize(("section", "env"), [(s, False) for s in SECTIONS]
                         + [(s, True) for s in ENV_SECTIONS])  # fmt: skip
def test_every_key_the_loader_accepts_is_documented(
    tmp_path: Path, section: str, env: bool
) -> None:
    text = DOC.read_text()
    part = (
        text[text.index("## Environment file") :] if env else text[: text.index("## Environment")]
    )
    heading = f"### `{section or '(top level)'}`"
    assert heading in part, f"no section {heading}"
    body = part[part.index(heading) :].split("\n### ", 1)[0]
    documented = re.findall(r"^\| `([^`]+)` \|", body, flags=re.MULTILINE)
    nested = set(SECTIONS[1:]) | set(ENV_SECTIONS)
    accepted = [k for k in _valid_keys(tmp_path, section, env=env) if k not in nested]
    assert accepted, "the loader listed no keys"
    assert sorted(documented) == sorted(accepted)
