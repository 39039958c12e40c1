"""spark-submit entry: `spark-submit jobs/ingest.py --pipeline NAME [--env ENV] [--once]`.

Parses arguments, loads the configuration, runs the pipeline, maps errors to exit codes
(0 done, 2 configuration or usage, 75 transient: safe to retry, 1 anything else).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdc_core.cli import configure_logging, guarded
from cdc_core.config import load_pipeline
from cdc_core.errors import EXIT_OK
from cdc_core.pipeline import RunOptions, run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ingest.py", description="Run one CDC pipeline.")
    parser.add_argument("--pipeline", required=True, help="pipeline name (pipelines/NAME.yaml)")
    parser.add_argument("--env", default="local", help="environment (conf/ENV.yaml), default local")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="drain the WAL seen at start (default)")
    mode.add_argument("--continuous", action="store_true", help="micro-batches until stopped")
    parser.add_argument("--max-batches", type=int, default=None, metavar="N")
    parser.add_argument(
        "--capture-only", action="store_true",
        help="read and stage only, without Spark; bronze and silver catch up on the next run",
    )  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parser.parse_args(argv)


def ingest(args: argparse.Namespace) -> int:
    config = load_pipeline(args.pipeline, args.env)
    options = RunOptions(args.continuous, args.max_batches, capture_only=args.capture_only)
    summary = run(config, options)
    print(summary.describe())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.debug)
    return guarded(ingest, args)


if __name__ == "__main__":
    sys.exit(main())
