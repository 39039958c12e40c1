"""Configuration: the only reader of YAML and environment variables; validated once, at load time.

`load_pipeline("orders", "local")` reads `pipelines/orders.yaml` and `conf/local.yaml` under the
project home (`$CDC_HOME`, or the working directory) into frozen dataclasses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from cdc_core.config.loader import Builder, FieldError, display_path, read_yaml, suggest
from cdc_core.config.model import (
    ByteSize,
    CaptureConfig,
    CatalogSettings,
    Config,
    Dsn,
    EnvConfig,
    PipelineConfig,
    SilverConfig,
    SnapshotConfig,
    SourceConfig,
    SparkSettings,
    TargetConfig,
)
from cdc_core.errors import ConfigError
from cdc_core.identifiers import TableName, catalog_name

__all__ = [
    "ByteSize",
    "CaptureConfig",
    "CatalogSettings",
    "Config",
    "Dsn",
    "EnvConfig",
    "PipelineConfig",
    "SilverConfig",
    "SnapshotConfig",
    "SourceConfig",
    "SparkSettings",
    "TargetConfig",
    "load_env",
    "load_pipeline",
    "project_home",
    "with_tables",
]


def project_home() -> Path:
    """Where `pipelines/` and `conf/` are looked up: `$CDC_HOME`, else the working directory."""
    return Path(os.environ.get("CDC_HOME") or Path.cwd())


def _locate(kind: str, name: str, folder: Path, home: Path) -> Path:
    """`name` as a file in `folder`, or as a path; a missing file lists what exists."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name)
    else:
        path = folder / f"{name}.yaml"
    if path.is_file():
        return path
    available = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    listing = f"available: {', '.join(available)}" if available else f"{folder} holds none"
    raise ConfigError(
        display_path(path, home),
        None,
        f"no such {kind} file ({listing}){suggest(Path(name).stem, available)}",
    )


def load_env(
    env: str = "local", *, home: Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[EnvConfig, str]:
    """Read `conf/<env>.yaml`; returns the settings and the file as shown in errors."""
    home = home or project_home()
    path = _locate("environment", env, home / "conf", home)
    shown = display_path(path, home)
    settings: EnvConfig = Builder(shown, environ).build(EnvConfig, read_yaml(path, shown))
    return settings, shown


def load_pipeline(
    name: str,
    env: str = "local",
    *,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Read and validate a pipeline and its environment; every problem is a `ConfigError`."""
    home = home or project_home()
    path = _locate("pipeline", name, home / "pipelines", home)
    shown = display_path(path, home)
    pipeline: PipelineConfig = Builder(shown, environ).build(PipelineConfig, read_yaml(path, shown))
    if pipeline.name != path.stem:
        raise ConfigError(
            shown,
            "name",
            f"{pipeline.name!r} does not match the file name {path.stem!r} "
            "(rename the file or change the name)",
        )
    pipeline = _resolve_signal_file(pipeline, path.parent)
    env_settings, env_shown = load_env(env, home=home, environ=environ)
    if env_settings.catalog.register:
        _check_catalog_names(pipeline, env_settings, env_shown)
    return Config(pipeline, env_settings, env, shown, env_shown)


def with_tables(config: Config, tables: Sequence[TableName]) -> Config:
    """`config` capturing `tables`, found in the source's catalog (`source.tables` omitted).
    The checks a load leaves until the tables are known run now, with the same errors (exit 2):
    names the lake can hold, keys that name captured tables, catalog names."""
    shown, source = config.pipeline_file, config.pipeline.source
    try:
        found = source.with_discovered(tables)
    except FieldError as e:
        raise ConfigError(shown, source.tables_key, f"a table it lets through: {e}") from e
    try:
        pipeline = replace(config.pipeline, source=found)  # checks the keys naming tables
    except FieldError as e:
        raise ConfigError(shown, e.key, str(e)) from e
    if config.env.catalog.register:
        _check_catalog_names(pipeline, config.env, config.env_file)
    return replace(config, pipeline=pipeline)


def _resolve_signal_file(pipeline: PipelineConfig, folder: Path) -> PipelineConfig:
    """`snapshot.signal.file` as an absolute path: a relative one is taken from the pipeline
    file's folder, so the file is the same whatever directory a run starts in."""
    written = Path(pipeline.snapshot.signal_file)
    if written.is_absolute():
        return pipeline
    resolved = str(folder.resolve() / written)
    return replace(pipeline, snapshot=replace(pipeline.snapshot, signal_file=resolved))


def _check_catalog_names(pipeline: PipelineConfig, env: EnvConfig, shown: str) -> None:
    """Each mirror under a catalog name of its own. Spark's catalog ignores case, and
    `CREATE TABLE IF NOT EXISTS` leaves a name taken by another mirror as it is: the second
    would silently not be registered."""
    seen: dict[tuple[str, str], TableName] = {}
    template = env.catalog.database
    for table in pipeline.source.tables:
        db = catalog_name(template.format(schema=table.schema))
        name = (db.lower(), catalog_name(table.name).lower())
        other = seen.setdefault(name, table)
        if other is not table:
            way = (
                "put {schema} in it"
                if other.schema.lower() != table.schema.lower()
                else "register one of them by hand, or leave one out of the pipeline"
            )
            raise ConfigError(
                shown,
                "catalog.database",
                f"{template!r} registers {other} and {table} under one name, "
                f"{name[0]}.{name[1]} (Spark's catalog ignores case, and holds other "
                f"characters than letters, digits and _ as _): {way}",
            )
