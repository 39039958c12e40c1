"""`python -m cdc_core.jobs NAME`: the installed file spark-submit runs for job NAME.

    spark-submit $(python -m cdc_core.jobs ingest) --pipeline orders

Without NAME, lists every job and its file.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cdc_core.errors import EXIT_OK, EXIT_USAGE
from cdc_core.jobs import JOBS


def job_file(name: str) -> Path:
    """The module of job `name`: runnable as a script, so spark-submit takes it as it is."""
    return Path(__file__).resolve().with_name(f"{name}.py")


def main(argv: Sequence[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        for name in JOBS:
            print(f"{name}\t{job_file(name)}")
        return EXIT_OK
    if len(names) > 1 or names[0] not in JOBS:
        print(f"usage: python -m cdc_core.jobs [{' | '.join(JOBS)}]", file=sys.stderr)
        return EXIT_USAGE
    print(job_file(names[0]))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
