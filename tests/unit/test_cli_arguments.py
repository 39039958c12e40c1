"""`cdc pg` and `cdc workload` arguments: a cluster name names a directory under the clusters'
home, never a path (a start that found no cluster there cleared the directory the name pointed
to, before refusing the port), a port is a TCP port, and the workload's counts and rates are
above 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_core.cli import main


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../victim", "..", ".hidden", "a/b", ""])
def test_a_cluster_name_that_is_a_path_is_refused_and_nothing_is_removed(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    home = tmp_path / "clusters"
    home.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("important")
    monkeypatch.setenv("CDC_PG_HOME", str(home))
    monkeypatch.chdir(home)

    for action in ("start", "destroy", "status"):
        assert main(["pg", action, "--name", name, "--port", "5432"]) == 2
        assert f"cluster name {name!r}: use letters, digits" in capsys.readouterr().err
    assert (victim / "keep.txt").read_text() == "important"
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("port", ["-1", "0", "70000", "abc"])
def test_a_port_outside_1_to_65535_is_a_usage_error(
    port: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("CDC_PG_HOME", str(tmp_path))
    assert main(["pg", "start", "--port", port]) == 2
    assert f"argument --port: {port!r} is not a TCP port (1 to 65535)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--changes", "-5"], "argument --changes: '-5': give 1 or more"),
        (["--rate", "0"], "argument --rate: '0': give a number above 0"),
        (["--rate", "-3"], "argument --rate: '-3': give a number above 0"),
        (["--concurrency", "0"], "argument --concurrency: '0': give 1 or more"),
        (["--duration", "-1"], "argument --duration: '-1': give a number above 0"),
    ],
)
def test_cdc_workload_refuses_counts_and_rates_below_1_as_usage_errors(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a ValueError from the workload's spec (exit 1, the whole spec printed), or for
    a negative duration a run that reported a lost connection it never had."""
    assert main(["workload", "--dsn", "host=127.0.0.1 port=1", *args]) == 2
    assert said in capsys.readouterr().err
