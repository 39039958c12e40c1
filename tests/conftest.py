"""Test tiers (unit, spark, integration, ecosystem): a per-tier summary, no silent skips under
CI, and each failure reported as it happens."""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import pytest

from cdc_core.config import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TIERS = ("unit", "spark", "integration", "ecosystem")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def unavailable(what: str) -> None:
    """A missing PostgreSQL or Delta: a failure under CI=true, a skip on a developer machine."""
    if IN_CI:
        pytest.fail(f"{what} (CI=true: a missing dependency is a failure, not a skip)")
    pytest.skip(what)


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """One process at a time in the block (test runs in one checkout, the workers of one run)."""
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _outcomes(reporter: pytest.TerminalReporter) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for outcome in ("passed", "failed", "skipped", "error", "xfailed", "xpassed"):
        for report in reporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            when = getattr(report, "when", "call")
            if nodeid and (when == "call" or outcome in ("skipped", "error")):
                counts[(tier_of(nodeid), outcome)] += 1
    return counts


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts = _outcomes(terminalreporter)
    terminalreporter.section("tests run per tier")
    for tier in (*TIERS, "other"):
        row = {o: counts[(tier, o)] for o in ("passed", "failed", "error", "skipped")}
        if tier == "other" and not any(row.values()):
            continue
        ran = row["passed"] + row["failed"] + row["error"]
        terminalreporter.write_line(
            f"{tier:<12} {ran:>4} ran: {row['passed']} passed, {row['failed']} failed, "
            f"{row['error']} errors, {row['skipped']} skipped"
        )
    skipped = sum(n for (_, o), n in counts.items() if o == "skipped")
    if IN_CI and skipped:
        terminalreporter.write_line(
            f"CI=true: {skipped} skipped test(s) count as failures", red=True
        )


# the order test files are handed to `make test`'s workers (it passes --no-loadscope-reorder):
# the longest first, the many short ones last to even out the end. By default pytest-xdist
# hands out the files with the most tests first, which left the crash suite (two tests, 13 to
# 20 minutes) among the last files, its run the whole run's tail.
_TIER_ORDER = ("integration", "ecosystem", "spark", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files of the crash suite first, then by tier (_TIER_ORDER); a stable sort, so tests
    keep their order within a file."""
    crash_files = {item.path for item in items if item.get_closest_marker("crash")}

    def order(item: pytest.Item) -> tuple[bool, int]:
        tier = tier_of(item.nodeid)
        rank = _TIER_ORDER.index(tier) if tier in _TIER_ORDER else len(_TIER_ORDER)
        return (item.path not in crash_files, rank)

    items.sort(key=order)


_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _config.append(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failure's report as it happens, not only in the summary: a run stopped at CI's time
    limit still says why its failed tests failed. (Workers leave it to the controller.)"""
    if not report.failed or os.environ.get("PYTEST_XDIST_WORKER") or not _config:
        return
    reporter = _config[0].pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    reporter.write_line("")
    reporter.write_sep("-", f"{report.when} failed: {report.nodeid}", red=True)
    reporter.write_line(report.longreprtext[-6000:])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if IN_CI and reporter is not None and reporter.stats.get("skipped") and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


TEST_SPARK = SparkSettings(
    master="local[2]",
    jars="resolve",
    conf=MappingProxyType(
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.log.level": "WARN",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            # the integration tier runs ingest in this one JVM, test after test, for some 50
            # minutes: at conf/local.yaml's 2g for a run, a last test ran out of heap building a
            # broadcast (2026-12-01)
            "spark.driver.memory": "3g",
            # catalog tables of their own each run: one left in ./spark-warehouse by an
            # earlier run fails the next (DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION)
            "spark.sql.warehouse.dir": (
                _WAREHOUSE := tempfile.mkdtemp(prefix="cdc-tests-warehouse-")
            ),
        }
    ),
)
# every process that imports this makes one (pytest-xdist's controller and workers): each
# removes its own as it exits, Spark or not
atexit.register(shutil.rmtree, _WAREHOUSE, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession with Delta for the run, built the way the product builds it."""
    from cdc_core.errors import SetupError
    from cdc_core.spark import build_spark

    try:
        session = build_spark(TEST_SPARK, "cdc-tests")
    except SetupError as e:
        unavailable(f"no Spark with Delta: {e}")
    yield session
    session.stop()
