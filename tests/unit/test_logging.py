"""Logs are one JSON object per line off a terminal, plain lines on one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from cdc_core.cli import JsonLogFormatter

SCRIPT = (
    "import logging; from cdc_core.cli import configure_logging; configure_logging(); "
    "logging.getLogger('cdc_core.x').warning('slot %s: \"quoted\" é', 'orders')"
)


def _run(env_format: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin"} | ({"CDC_LOG_FORMAT": env_format} if env_format else {})
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return proc.stderr.strip()


def test_off_a_terminal_each_line_is_a_json_object() -> None:
    line = json.loads(_run(None))  # stderr is a pipe here
    assert line["level"] == "WARNING"
    assert line["logger"] == "cdc_core.x"
    assert line["message"] == 'slot orders: "quoted" é'
    assert line["ts"].endswith("+00:00")


def test_text_when_asked() -> None:
    assert _run("text").endswith('WARNING cdc_core.x: slot orders: "quoted" é')


def test_exceptions_are_kept_in_the_object() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    data = json.loads(JsonLogFormatter().format(record))
    assert "ValueError: boom" in data["exception"]
