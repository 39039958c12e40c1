"""The job entry points: ingest and maintain, with their shared options, logging and exit
codes, and validate (`cdc validate` as a job file).

Each job module has `main(argv) -> int`, run by `spark-submit jobs/NAME.py` from a checkout and
by `spark-submit $(python -m cdc_core.jobs NAME)` from an installed wheel. Ingest and maintain
also have `cli()`, the `cdc-NAME` console script (a Databricks python_wheel_task entry point).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cdc_core.cli import Command, configure_logging, guarded
from cdc_core.errors import EXIT_OK

JOBS = ("ingest", "validate", "maintain")


def job_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every job takes: --pipeline, --env, --debug."""
    parser = argparse.ArgumentParser(description=description)  # prog: the file or the script
    parser.add_argument("--pipeline", required=True, help="pipeline name (pipelines/NAME.yaml)")
    parser.add_argument("--env", default="local", help="environment (conf/ENV.yaml), default local")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parser


def run_job(parser: argparse.ArgumentParser, command: Command, argv: Sequence[str] | None) -> int:
    """Parse `argv`, set up logging, run `command`; every failure becomes an exit code."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors (its message already printed)
        return int(e.code or 0)
    configure_logging(args.debug)
    return guarded(command, args)


def exit_on_failure(code: int) -> None:
    """Raise SystemExit for a failed job: callers that ignore a return value (Databricks
    python_wheel_task) still see the failure; success returns, so no one sees SystemExit(0)."""
    if code != EXIT_OK:
        raise SystemExit(code)
