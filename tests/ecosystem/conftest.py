"""The ecosystem tier: the Airflow DAG, the Databricks bundle and the wheel, checked by the tools
that use them. Airflow lives in its own virtualenv (.venv-airflow), built once and reused."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import exclusive

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_DIR = ROOT / "orchestration" / "airflow"
AIRFLOW_VENV = Path(os.environ.get("CDC_AIRFLOW_VENV") or ROOT / ".venv-airflow")
INSTALL_TIMEOUT_S = 900


def airflow_digest() -> str:
    """What the installed virtualenv must match: the pins and this Python's version."""
    h = hashlib.sha256(sys.version.encode())
    for name in ("requirements.txt", "constraints.txt"):
        h.update((AIRFLOW_DIR / name).read_bytes())
    return h.hexdigest()


def install_airflow(venv: Path) -> None:
    """A fresh virtualenv with the pinned Airflow; raises CalledProcessError with pip's output."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
            "--quiet", "--disable-pip-version-check",
            "-r", str(AIRFLOW_DIR / "requirements.txt"), "-c", str(AIRFLOW_DIR / "constraints.txt"),
        ],
        check=True, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
    )  # fmt: skip


@pytest.fixture(scope="session")
def airflow_python() -> Path:
    """The Python of .venv-airflow, installed when missing or stale (stamp = digest of the pins).
    A failed install fails the tests that need it: Airflow is never optional here."""
    python = AIRFLOW_VENV / "bin" / "python"
    stamp = AIRFLOW_VENV / ".cdc-installed"
    digest = airflow_digest()
    with exclusive(AIRFLOW_VENV.with_name(AIRFLOW_VENV.name + ".lock")):
        if python.is_file() and stamp.is_file() and stamp.read_text() == digest:
            return python
        started = time.monotonic()
        try:
            install_airflow(AIRFLOW_VENV)
        except subprocess.CalledProcessError as e:
            tail = "\n".join(((e.stderr or "") + (e.stdout or "")).strip().splitlines()[-15:])
            pytest.fail(f"cannot install Airflow into {AIRFLOW_VENV}: {tail}")
        except subprocess.TimeoutExpired:
            pytest.fail(f"installing Airflow into {AIRFLOW_VENV} took over {INSTALL_TIMEOUT_S} s")
        stamp.write_text(digest)
        print(f"installed Airflow into {AIRFLOW_VENV} in {time.monotonic() - started:.0f} s")
    return python
