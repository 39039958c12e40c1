"""The validate job: `spark-submit jobs/validate.py --pipeline NAME [--table T] [--env ENV]`.

The same as `cdc validate ...`, as a file a cluster runs: spark-submit, a Databricks
spark_python_task.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cdc_core.cli import main as cdc


def main(argv: Sequence[str] | None = None) -> int:
    return cdc(["validate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
