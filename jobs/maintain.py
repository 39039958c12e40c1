"""spark-submit entry: `spark-submit jobs/maintain.py --pipeline NAME [--env ENV]`.

The job itself is `cdc_core.jobs.maintain` (also the `cdc-maintain` command of the installed
wheel).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import cdc_core  # noqa: F401
except ModuleNotFoundError:  # a checkout that is not installed (Databricks workspace files)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc_core.jobs.maintain import main

if __name__ == "__main__":
    sys.exit(main())
