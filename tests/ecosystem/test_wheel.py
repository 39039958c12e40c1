"""The wheel `pip install .` builds: cdc_core with its data, the `cdc`, `cdc-ingest` and
`cdc-maintain` commands, and job files spark-submit runs from the installed package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.ecosystem.conftest import ROOT

SCRIPTS = {
    "cdc": "cdc_core.cli:main",
    "cdc-ingest": "cdc_core.jobs.ingest:cli",
    "cdc-maintain": "cdc_core.jobs.maintain:cli",
}
NO_SUCH_PIPELINE = "error: pipelines/nope.yaml: no such pipeline file"  # then: where it looked


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def source(workdir: Path) -> Path:
    """A clean copy of what the wheel is built from (no stale build/ of the checkout)."""
    source = workdir / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "cdc_core", source / "cdc_core", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    return source


@pytest.fixture(scope="module")
def wheel(source: Path, workdir: Path) -> Path:
    """`pip wheel . --no-deps`."""
    dist = workdir / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--quiet",
         "--disable-pip-version-check", "--wheel-dir", str(dist)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [built] = dist.glob("cdc_lake-*.whl")
    return built


def bare_venv(venv: Path) -> Path:
    """An empty virtualenv that sees the project venv's packages (pyspark, psycopg...) through a
    .pth line, but not its editable cdc_core: that .pth file of the project venv is not read."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "project_venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.fixture(scope="module")
def venv(workdir: Path) -> Path:
    return bare_venv(workdir / "venv")


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command of `venv` (a script of its bin/, or an absolute path) from an empty project
    home (no pipelines/ there); spark-submit drives `venv`'s Python."""
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "CDC_HOME": str(cwd), "CDC_LOG_FORMAT": "text", "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python, "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(ROOT / "conf" / "spark"),
    }  # fmt: skip
    program = args[0] if Path(args[0]).is_absolute() else str(venv / "bin" / args[0])
    return subprocess.run(
        [program, *args[1:]], check=False, capture_output=True, text=True, env=env, cwd=cwd,
        timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(wheel: Path, venv: Path, workdir: Path) -> Path:
    """`venv` with the wheel installed (--no-deps); returns an empty project home."""
    home = workdir / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-index", "--ignore-installed", "--quiet", "--disable-pip-version-check",
         str(wheel)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home


def test_the_wheel_holds_every_module_and_the_sample_data(wheel: Path, source: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(source).as_posix() for p in (source / "cdc_core").rglob("*.py")}
    assert modules <= names, modules - names
    assert {"cdc_core/py.typed", "cdc_core/sample/shop.sql"} <= names
    assert {"cdc_core/jobs/ingest.py", "cdc_core/jobs/maintain.py", "cdc_core/jobs/__main__.py"} <= names  # fmt: skip
    assert not {n for n in names if n.startswith(("jobs/", "tests/", "pipelines/", "conf/"))}


def test_the_wheel_declares_the_three_commands(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        [entry_points] = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(entry_points).decode()
    lines = text.split("[console_scripts]", 1)[1].split("[", 1)[0].strip().splitlines()
    assert dict(line.split(" = ") for line in lines) == SCRIPTS


def test_a_checkout_job_file_runs_without_the_package_installed(tmp_path: Path) -> None:
    venv = bare_venv(tmp_path / "venv")
    assert run(venv, "python", "-c", "import cdc_core", cwd=tmp_path).returncode != 0
    proc = run(venv, "python", str(ROOT / "jobs" / "ingest.py"), "--pipeline", "nope", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(NO_SUCH_PIPELINE), proc.stderr


def test_the_installed_package_is_the_one_imported(venv: Path, installed: Path) -> None:
    code = (
        "import cdc_core, importlib.resources as r; print(cdc_core.__file__); "
        "print(r.files('cdc_core.sample').joinpath('shop.sql').is_file())"
    )
    proc = run(venv, "python", "-c", code, cwd=installed)
    assert proc.returncode == 0, proc.stderr
    where, has_sql = proc.stdout.split()
    assert Path(where).is_relative_to(venv), where
    assert has_sql == "True"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_command_runs(venv: Path, installed: Path, script: str) -> None:
    proc = run(venv, script, "--help", cwd=installed)
    assert proc.returncode == 0, proc.stderr
    assert "--pipeline" in proc.stdout or script == "cdc"


def test_a_job_command_exits_with_the_job_exit_code(venv: Path, installed: Path) -> None:
    proc = run(venv, "cdc-ingest", "--pipeline", "nope", cwd=installed)
    assert proc.returncode == 2
    assert proc.stderr.startswith(NO_SUCH_PIPELINE), proc.stderr


def test_spark_submit_runs_the_installed_job_file(venv: Path, installed: Path) -> None:
    found = run(venv, "python", "-m", "cdc_core.jobs", "maintain", cwd=installed)
    assert found.returncode == 0, found.stderr
    job_file = Path(found.stdout.strip())
    assert job_file.is_relative_to(venv)
    assert job_file.name == "maintain.py"
    spark_submit = Path(sysconfig.get_path("scripts")) / "spark-submit"  # the project venv's
    proc = run(venv, str(spark_submit), str(job_file), "--pipeline", "nope", cwd=installed)
    assert proc.returncode == 2, proc.stderr
    output = proc.stdout.splitlines()  # spark-submit sends the driver's stderr to its stdout
    assert any(line.startswith(NO_SUCH_PIPELINE) for line in output), proc.stdout + proc.stderr
