"""spark-submit entry: `spark-submit jobs/ingest.py --pipeline NAME [--env ENV] [--once]`.

The job itself is `cdc_core.jobs.ingest` (also the `cdc-ingest` command of the installed wheel).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import cdc_core  # noqa: F401
except ModuleNotFoundError:  # a checkout that is not installed (Databricks workspace files)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc_core.jobs.ingest import main

if __name__ == "__main__":
    sys.exit(main())
