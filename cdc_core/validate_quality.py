"""`cdc validate`'s data quality: a great-expectations suite per silver table, with Data Docs.

Each suite checks the silver table the parity check compared (the same Delta version, without
soft-deleted rows): the key unique and not NULL (`_cdc_row_hash` for a table without a key),
the columns and their types as silver declares them, and the pipeline file's
`validate.expectations`. GX runs on the Spark DataFrame itself (its Spark datasource): no table
is collected to the driver, so suites scale with the cluster. The Data Docs site is written to
`<root>/_state/quality/` (through Hadoop's file system when the lake is not local).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from cdc_core.config.loader import suggest
from cdc_core.config.validate import ColumnExpectation
from cdc_core.errors import ConfigError, first_line
from cdc_core.identifiers import TableName
from cdc_core.lake import Lake
from cdc_core.pgtypes import SilverType
from cdc_core.silver_shape import TableShape, describe, spark_type
from cdc_core.storage import Location

log = logging.getLogger("cdc_core.validate")
SITE = "quality"


@dataclass(frozen=True)
class Outcome:
    """One expectation on one table, as it came out."""

    table: str
    expectation: str  # GX's name, e.g. expect_column_values_to_be_in_set
    column: str | None
    success: bool
    origin: str  # key, schema, or the pipeline file key that asked for it
    detail: str = ""


@dataclass
class QualityReport:
    docs: str | None  # the Data Docs index
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]


@dataclass(frozen=True)
class Suite:
    """What one table is checked for: (GX expectation class name, its arguments, origin)."""

    table: TableName
    checks: tuple[tuple[str, dict[str, Any], str], ...]
    declared: dict[str, T.DataType]  # column -> declared silver type, for the exact check


def build_suite(
    table: TableName, shape: TableShape, expectations: Sequence[tuple[int, ColumnExpectation]],
    pipeline_file: str,
) -> Suite:  # fmt: skip
    """The checks of one table; a user expectation naming a column the mirror does not have,
    or a value its type cannot take, is a `ConfigError` naming the file and the key."""
    schema = shape.spark_schema()
    checks: list[tuple[str, dict[str, Any], str]] = [
        ("ExpectTableColumnsToMatchSet", {"column_set": schema.fieldNames(), "exact_match": True},
         "schema"),
    ]  # fmt: skip
    key = list(shape.key) or ["_cdc_row_hash"]
    checks += [("ExpectColumnValuesToNotBeNull", {"column": k}, "key") for k in key]
    if len(key) == 1:
        checks.append(("ExpectColumnValuesToBeUnique", {"column": key[0]}, "key"))
    else:
        checks.append(("ExpectCompoundColumnsToBeUnique", {"column_list": key}, "key"))
    checks += [
        ("ExpectColumnValuesToBeOfType", {"column": f.name, "type_": type(f.dataType).__name__},
         "schema")
        for f in schema.fields
    ]  # fmt: skip
    types = {c.name: c.silver for c in shape.columns}
    for i, e in expectations:
        checks += _user_checks(e, types, f"validate.expectations[{i}]", pipeline_file)
    declared = {c.name: spark_type(c.silver) for c in shape.columns}
    return Suite(table, tuple(checks), declared)


def check_patterns(
    spark: SparkSession, expectations: Sequence[tuple[int, ColumnExpectation]], pipeline_file: str
) -> None:
    """Each `regex` compiled as Spark's `rlike` will compile it (java.util.regex, whose syntax
    differs from Python's: `\\p{Lu}` and `\\Q...\\E` are Java's): a `ConfigError` naming the
    key for one that does not compile."""
    pattern = spark.sparkContext._jvm.java.util.regex.Pattern  # type: ignore[union-attr]
    for i, e in expectations:
        if e.regex is None:
            continue
        try:
            pattern.compile(e.regex)
        except Exception as error:  # a PatternSyntaxException, as PySpark or py4j wraps it
            problem = (str(error).strip().splitlines() or ["cannot compile"])[0]
            raise ConfigError(
                pipeline_file, f"validate.expectations[{i}].regex",
                f"{e.regex!r} is not a regular expression (Java syntax, as Spark's rlike): "
                f"{problem}",
            ) from None  # fmt: skip


def _user_checks(
    e: ColumnExpectation, types: dict[str, SilverType], key: str, file: str
) -> list[tuple[str, dict[str, Any], str]]:
    t = types.get(e.column)
    if t is None:
        raise ConfigError(file, f"{key}.column", f"{e.table} has no column {e.column!r} in "
                          f"silver{suggest(e.column, types)}")  # fmt: skip
    base: dict[str, Any] = {"column": e.column}
    mostly = {"mostly": e.mostly} if e.mostly < 1 else {}
    out: list[tuple[str, dict[str, Any], str]] = []
    if e.not_null:
        out.append(("ExpectColumnValuesToNotBeNull", base | mostly, key))
    if e.unique:
        out.append(("ExpectColumnValuesToBeUnique", base | mostly, key))
    if e.min is not None or e.max is not None:
        bounds = {"min_value": _value(e.min, t, f"{key}.min", file),
                  "max_value": _value(e.max, t, f"{key}.max", file)}  # fmt: skip
        out.append(("ExpectColumnValuesToBeBetween", base | bounds | mostly, key))
    if e.in_set:
        values = [_value(v, t, f"{key}.in_set[{n}]", file) for n, v in enumerate(e.in_set)]
        out.append(("ExpectColumnValuesToBeInSet", base | {"value_set": values} | mostly, key))
    if e.regex is not None:
        if t.name != "string":
            raise ConfigError(file, f"{key}.regex", f"{e.table}.{e.column} is {describe(t)} in "
                              "silver: a regex applies to string columns only")  # fmt: skip
        out.append(("ExpectColumnValuesToMatchRegex", base | {"regex": e.regex} | mostly, key))
    return out


def _value(text: str | None, t: SilverType, key: str, file: str) -> object:
    """A constraint's value as the column's silver type holds it."""
    if text is None:
        return None
    if t.name == "string":
        return text
    text = text.strip()
    try:
        if t.name in ("short", "int", "long"):
            number = Decimal(text)
            if number == number.to_integral_value():
                return int(number)
        elif t.name in ("float", "double"):
            return float(text)
        elif t.name == "decimal":
            return Decimal(text)
        elif t.name == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        elif t.name == "date":
            return date.fromisoformat(text)
        elif t.name in ("timestamp", "timestamp_ntz"):
            moment = datetime.fromisoformat(text)
            if t.name == "timestamp" and moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            return moment
    except (ValueError, InvalidOperation):
        pass
    raise ConfigError(file, key, f"{text!r} is not a value of the column's silver type "
                      f"{describe(t)}")  # fmt: skip


def run_quality(suites: Sequence[tuple[Suite, DataFrame]], lake: Lake) -> QualityReport:
    """Run every suite on its DataFrame and write the Data Docs under <root>/_state/quality
    (on an object store, through the lake's own client, as the driver's other files). Docs that
    cannot be written are said, and leave the verdict as it is."""
    started = time.monotonic()
    if not suites:  # every table's comparison failed: nothing to check, no docs written
        return QualityReport("not written (no table to check)")
    target = lake.state / SITE
    local = target if isinstance(target, Path) else None
    with tempfile.TemporaryDirectory(prefix="cdc-quality-") as scratch:
        site = local if local is not None else Path(scratch)
        report = QualityReport(str(target / "index.html"))
        context = _context(site)
        for suite, frame in suites:
            report.outcomes += _exact_types(suite, frame)
            report.outcomes += _run_suite(context, suite, frame)
        if local is None:
            try:
                _upload(site, target)
            except OSError as e:
                log.warning("Data Docs not written to %s: %s", target, first_line(e))
                report.docs = f"not written ({first_line(e)})"
    report.seconds = time.monotonic() - started
    return report


def _context(site: Path) -> Any:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # never phone home
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    for name in ("great_expectations", "py4j"):
        logging.getLogger(name).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.add_data_docs_site(site_name=SITE, site_config={
        "class_name": "SiteBuilder",
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                          "base_directory": str(site)},
    })  # fmt: skip
    context.data_sources.add_spark("silver")
    return context


def _run_suite(context: Any, suite: Suite, frame: DataFrame) -> list[Outcome]:
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.checkpoint.actions import UpdateDataDocsAction
    from great_expectations.core.run_identifier import RunIdentifier

    name = suite.table.qualified
    asset = context.data_sources.get("silver").add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe(f"{name} (live rows)")
    expectations = context.suites.add(gx.ExpectationSuite(name=name))
    for kind, kwargs, origin in suite.checks:
        expectations.add_expectation(getattr(gxe, kind)(**kwargs, meta={"origin": origin}))
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch, suite=expectations)
    )
    checkpoint = context.checkpoints.add(gx.Checkpoint(
        name=name, validation_definitions=[validation],
        actions=[UpdateDataDocsAction(name="docs", site_names=[SITE])],
    ))  # fmt: skip
    result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=RunIdentifier("validate"))
    return [_outcome(name, r) for run in result.run_results.values() for r in run.results]


def _outcome(table: str, r: Any) -> Outcome:
    config = r.expectation_config
    kwargs = config.kwargs
    column = kwargs.get("column") or ",".join(kwargs.get("column_list") or []) or None
    origin = str((config.meta or {}).get("origin", ""))
    return Outcome(table, config.type, column, bool(r.success), origin, _detail(r))


def _detail(r: Any) -> str:
    info = r.exception_info or {}
    if info.get("raised_exception"):
        return f"could not run: {first_line(str(info.get('exception_message', '')))}"
    result = r.result or {}
    if result.get("unexpected_count"):
        total = result.get("element_count")
        sample = ", ".join(repr(v) for v in (result.get("partial_unexpected_list") or [])[:3])
        of = f" of {total:,}" if isinstance(total, int) else ""
        return f"{result['unexpected_count']:,}{of} values unexpected" + (
            f", e.g. {sample}" if sample else ""
        )
    if "observed_value" in result and not r.success:
        return f"observed {result['observed_value']}"
    return ""


def _exact_types(suite: Suite, frame: DataFrame) -> list[Outcome]:
    """GX checks a Spark type's class (DecimalType); this checks precision, scale, elements."""
    actual = {f.name: f.dataType for f in frame.schema.fields}
    out = []
    for name, declared in suite.declared.items():
        got = actual.get(name)
        ok = got == declared
        shown = got.simpleString() if got is not None else "no such column"
        detail = "" if ok else f"declared {declared.simpleString()}, silver has {shown}"
        out.append(Outcome(suite.table.qualified, "column_type_is_declared_type", name, ok,
                           "schema", detail))  # fmt: skip
    return out


def _upload(site: Path, target: Location) -> None:
    """Copy the Data Docs site to a lake that is not on the local file system."""
    for path in sorted(p for p in site.rglob("*") if p.is_file()):
        (target / path.relative_to(site).as_posix()).write_bytes(path.read_bytes())
