"""The maintenance job: `spark-submit jobs/maintain.py --pipeline NAME [--env ENV]`, `cdc-maintain`.

Compacts and vacuums the pipeline's Delta tables, removes staged files bronze already holds and,
when configured, bronze rows past the retention that silver has merged (`maintenance:` in the
pipeline file). Safe while ingest runs. Exit codes as ingest: 0 done, 2 configuration or usage,
75 transient (a concurrent ingest commit won on a table: run it again), 1 anything else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdc_core.config import load_pipeline
from cdc_core.errors import EXIT_OK
from cdc_core.jobs import exit_on_failure, job_parser, run_job
from cdc_core.maintenance import check, maintain


def run_maintenance(args: argparse.Namespace) -> int:
    config = load_pipeline(args.pipeline, args.env)
    summary = maintain(config)
    print(summary.describe())
    check(summary)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    return job_parser("Compact, vacuum and trim one pipeline's lake.")


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(build_parser(), run_maintenance, argv)


def cli() -> None:
    """The `cdc-maintain` command."""
    exit_on_failure(main())


if __name__ == "__main__":
    sys.exit(main())
