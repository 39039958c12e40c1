"""How to start the job entry points with this installation's spark-submit and Python."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from cdc_core.config import project_home
from cdc_core.errors import SetupError


def spark_submit() -> str:
    """spark-submit next to this Python (the project venv), else the one on PATH."""
    beside_python = Path(sys.executable).parent / "spark-submit"
    found = str(beside_python) if beside_python.is_file() else shutil.which("spark-submit")
    if not found:
        raise SetupError("spark-submit not found: run `make demo` or `make test` (they install it)")
    return found


def submit_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a spark-submit child: this Python drives it and runs its workers."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    project_conf = project_home() / "conf" / "spark"
    if project_conf.is_dir():
        env.setdefault("SPARK_CONF_DIR", str(project_conf))  # quiet log4j2.properties
    env.update(extra or {})
    return env
