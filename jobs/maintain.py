"""spark-submit entry: `spark-submit jobs/maintain.py --pipeline NAME [--env ENV]`.

Compacts and vacuums the pipeline's Delta tables, removes staged files bronze already holds and,
when configured, bronze rows past the retention that silver has merged (`maintenance:` in the
pipeline file). Safe while ingest runs. Exit codes as ingest: 0 done, 2 configuration or usage,
75 transient (a concurrent ingest commit won on a table: run it again), 1 anything else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cdc_core.cli import configure_logging, guarded
from cdc_core.config import load_pipeline
from cdc_core.errors import EXIT_OK
from cdc_core.maintenance import check, maintain


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="maintain.py", description="Compact, vacuum and trim one pipeline's lake."
    )
    parser.add_argument("--pipeline", required=True, help="pipeline name (pipelines/NAME.yaml)")
    parser.add_argument("--env", default="local", help="environment (conf/ENV.yaml), default local")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parser.parse_args(argv)


def run_maintenance(args: argparse.Namespace) -> int:
    config = load_pipeline(args.pipeline, args.env)
    summary = maintain(config)
    print(summary.describe())
    check(summary)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.debug)
    return guarded(run_maintenance, args)


if __name__ == "__main__":
    sys.exit(main())
