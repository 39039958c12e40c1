"""Standard output that cannot be written: a reader gone (`cdc status | head -1`) ends the
command quietly, as a SIGPIPE would; a full disk is named in one line. Both used to end in an
"unexpected" error, and a second one from the interpreter's exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def status_command(home: Path) -> tuple[list[str], dict[str, str]]:
    """`cdc status` of a pipeline whose server is down (port 1): it prints its lines at once."""
    (home / "pipelines").mkdir()
    (home / "conf").mkdir()
    (home / "conf" / "local.yaml").write_text("spark:\n  master: local[1]\n")
    (home / "pipelines" / "p.yaml").write_text(
        "name: p\nsource:\n  dsn: postgresql://postgres@127.0.0.1:1/shop\n  slot: p_cdc\n"
        f"  publication: p_cdc\n  tables: [public.t]\ntarget:\n  root: {home / 'lake'}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env |= {"CDC_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return [sys.executable, "-m", "cdc_core.cli", "status", "--pipeline", "p"], env


def test_output_whose_reader_went_away_ends_quietly_with_141(tmp_path: Path) -> None:
    command, env = status_command(tmp_path)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()  # before the child has even imported what it needs
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, err
    assert "Error" not in err, err  # nor the interpreter's "Exception ignored ... BrokenPipeError"
    assert "error:" not in err, err


def test_output_that_cannot_be_written_is_named_in_one_line(tmp_path: Path) -> None:
    command, env = status_command(tmp_path)
    with open("/dev/full", "w") as full:
        run = subprocess.run(command, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=120, check=False)  # fmt: skip
    assert run.returncode == 1, run.stderr
    said = [line for line in run.stderr.splitlines() if "rror" in line]
    assert said == ["error: standard output cannot be written: [Errno 28] No space left on device"]

    with open(os.devnull, "w") as sink:  # the same command, written: the server is down (75)
        assert subprocess.run(command, env=env, stdout=sink, check=False).returncode == 75
