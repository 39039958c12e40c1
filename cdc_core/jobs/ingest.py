"""The ingest job: `spark-submit jobs/ingest.py --pipeline NAME [--env ENV] [--once]`, `cdc-ingest`.

Loads the configuration, runs the pipeline, maps errors to exit codes (0 done, 2 configuration
or usage, 75 transient: safe to retry, 1 anything else).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdc_core import faults
from cdc_core.cli import positive
from cdc_core.config import load_pipeline
from cdc_core.errors import EXIT_OK, UsageError
from cdc_core.jobs import exit_on_failure, job_parser, run_job
from cdc_core.pipeline import RunOptions, run


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser("Run one CDC pipeline.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="drain the WAL seen at start (default)")
    mode.add_argument("--continuous", action="store_true", help="micro-batches until stopped")
    parser.add_argument("--max-batches", type=positive, default=None, metavar="N",
                        help="--continuous: stop after N batches")  # fmt: skip
    parser.add_argument(
        "--capture-only", action="store_true",
        help="read and stage only, without Spark; bronze and silver catch up on the next run",
    )  # fmt: skip
    return parser


def ingest(args: argparse.Namespace) -> int:
    faults.check_env()  # a misspelt injection point must not make a crash test pass
    if args.max_batches is not None and not args.continuous:
        raise UsageError("--max-batches N applies to --continuous (a --once run is one batch)")
    config = load_pipeline(args.pipeline, args.env)
    options = RunOptions(args.continuous, args.max_batches, capture_only=args.capture_only)
    summary = run(config, options)
    print(summary.describe())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(build_parser(), ingest, argv)


def cli() -> None:
    """The `cdc-ingest` command."""
    exit_on_failure(main())


if __name__ == "__main__":
    sys.exit(main())
