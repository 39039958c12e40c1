"""The harness's own guard: a job run in the test worker that kills the worker's Spark driver
fails its case, saying so, instead of passing and leaving every later case of the worker to fail
with connection refused (what `make slow`'s 100 MB cases did before their runs became children).

The guard reads the run's log for the words every such message of the product begins with
(`DriverDiedError.SAID`); these tests say them through the product's own message builder."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from cdc_core.apply import driver_died_in_batch
from cdc_core.config import load_pipeline
from tests.integration.conftest import PgServer
from tests.integration.harness import make_pipeline


def says(message: str) -> int:
    logging.getLogger("cdc_core.jobs").error(message)
    return 1


def test_a_run_here_that_kills_the_workers_driver_fails_its_case(
    tmp_path: Path, pg: PgServer
) -> None:
    p = make_pipeline(tmp_path, pg.dsn(), ["public.t"])  # the file only: nothing runs on it

    def died(argv: Sequence[str]) -> int:  # the config as the run has it, in the pipeline's home
        return says(driver_died_in_batch(load_pipeline("p", "local")))

    with pytest.raises(pytest.fail.Exception, match="killed the test worker's Spark driver"):
        p._job(died, "ingest", (), timeout=60, child=False)


def test_a_run_here_that_fails_otherwise_is_its_exit_code_and_log(
    tmp_path: Path, pg: PgServer
) -> None:
    p = make_pipeline(tmp_path, pg.dsn(), ["public.t"])  # the file only: nothing runs on it

    run = p._job(lambda argv: says("the Spark session ended"), "maintain", (), 60, child=False)

    assert run.returncode == 1
    line = json.loads(run.stderr.splitlines()[-1])  # a JSON log line, as a child's
    assert (line["level"], line["message"]) == ("ERROR", "the Spark session ended")
    assert run.args[1].endswith("jobs/maintain.py")
