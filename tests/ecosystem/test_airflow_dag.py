"""orchestration/airflow/cdc_lake_dag.py, loaded by Airflow itself (a DagBag in .venv-airflow)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.ecosystem.conftest import AIRFLOW_DIR, ROOT

PROBE = Path(__file__).with_name("dagbag_probe.py")
CUSTOM = {
    "pipelines": "orders, inventory",
    "home": "/opt/cdc-lake",
    "env": "prod",
    "spark_conn_id": "spark_cluster",
    "cdc_command": "/opt/venv/bin/cdc",
    "python": "/opt/venv/bin/python",
    "lake_root": "s3a://lake",
    "schedule": "@hourly",
}


@pytest.fixture(scope="module")
def bags(airflow_python: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """DagBags for: no `cdc_lake` Variable, every key set, an unknown key."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env |= {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run(
        [str(airflow_python), str(PROBE), str(AIRFLOW_DIR), json.dumps([None, CUSTOM, {"pipe": 1}])],
        check=False, capture_output=True, text=True, env=env, cwd=home, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def dag(bags: list[dict[str, Any]]) -> dict[str, Any]:
    assert bags[0]["import_errors"] == {}
    assert list(bags[0]["dags"]) == ["cdc_lake_orders"]
    found: dict[str, Any] = bags[0]["dags"]["cdc_lake_orders"]
    return found


def test_the_dag_folder_loads_with_no_import_errors(bags: list[dict[str, Any]]) -> None:
    assert bags[0]["import_errors"] == {}
    assert bags[1]["import_errors"] == {}


def test_ingest_then_validate_then_maintain(dag: dict[str, Any]) -> None:
    tasks = dag["tasks"]
    assert set(tasks) == {"ingest", "validate", "maintain"}
    assert (tasks["ingest"]["upstream"], tasks["ingest"]["downstream"]) == ([], ["validate"])
    assert (tasks["validate"]["upstream"], tasks["validate"]["downstream"]) == (
        ["ingest"],
        ["maintain"],
    )
    assert (tasks["maintain"]["upstream"], tasks["maintain"]["downstream"]) == (["validate"], [])


def test_runs_every_15_minutes_and_never_two_at_once(dag: dict[str, Any]) -> None:
    assert dag["schedule"] == "*/15 * * * *"
    assert dag["max_active_runs"] == 1
    assert dag["catchup"] is False


def test_spark_jobs_submit_the_repository_job_files(dag: dict[str, Any]) -> None:
    ingest, maintain = dag["tasks"]["ingest"], dag["tasks"]["maintain"]
    assert ingest["operator"] == maintain["operator"] == "SparkSubmitOperator"
    assert ingest["application"] == str(ROOT / "jobs" / "ingest.py")
    assert maintain["application"] == str(ROOT / "jobs" / "maintain.py")
    assert Path(ingest["application"]).is_file()
    assert Path(maintain["application"]).is_file()
    assert ingest["conn_id"] == maintain["conn_id"] == "spark_default"
    assert ingest["env_vars"] == maintain["env_vars"] == {"CDC_HOME": str(ROOT)}


def test_spark_submit_args_render_to_the_job_command_line(dag: dict[str, Any]) -> None:
    assert dag["params"] == {"env": "local"}
    ingest, maintain = dag["tasks"]["ingest"], dag["tasks"]["maintain"]
    assert ingest["rendered_args"] == ["--pipeline", "orders", "--env", "local", "--once"]
    assert maintain["rendered_args"] == ["--pipeline", "orders", "--env", "local"]
    assert ingest["retries"] == 2  # exit 75 is transient: the retry resumes


def test_validate_runs_cdc_validate_and_is_not_retried(dag: dict[str, Any]) -> None:
    validate = dag["tasks"]["validate"]
    assert validate["operator"] == "BashOperator"
    assert validate["rendered_command"] == "cdc validate --pipeline orders --env local"
    assert validate["env"] == {"CDC_HOME": str(ROOT)}
    assert validate["retries"] == 0


def test_the_env_param_only_takes_an_environment_name(dag: dict[str, Any]) -> None:
    assert dag["param_schemas"]["env"]["pattern"] == r"^[\w.-]+$"


def test_the_cdc_lake_variable_sets_pipelines_paths_and_connection(
    bags: list[dict[str, Any]],
) -> None:
    dags = bags[1]["dags"]
    assert sorted(dags) == ["cdc_lake_inventory", "cdc_lake_orders"]
    inventory = dags["cdc_lake_inventory"]
    assert inventory["schedule"] == "@hourly"
    assert inventory["params"] == {"env": "prod"}
    ingest = inventory["tasks"]["ingest"]
    assert ingest["application"] == "/opt/cdc-lake/jobs/ingest.py"
    assert ingest["conn_id"] == "spark_cluster"
    assert ingest["rendered_args"] == ["--pipeline", "inventory", "--env", "prod", "--once"]
    assert ingest["env_vars"] == {
        "CDC_HOME": "/opt/cdc-lake",
        "LAKE_ROOT": "s3a://lake",
        "PYSPARK_PYTHON": "/opt/venv/bin/python",
        "PYSPARK_DRIVER_PYTHON": "/opt/venv/bin/python",
    }
    validate = inventory["tasks"]["validate"]
    assert (
        validate["rendered_command"] == "/opt/venv/bin/cdc validate --pipeline inventory --env prod"
    )


def test_an_unknown_key_in_the_variable_is_an_import_error(bags: list[dict[str, Any]]) -> None:
    errors = bags[2]["import_errors"]
    assert bags[2]["dags"] == {}
    assert len(errors) == 1
    assert "Airflow Variable cdc_lake: unknown key(s) pipe" in next(iter(errors.values()))


def test_the_task_command_lines_parse_with_the_entry_points(dag: dict[str, Any]) -> None:
    from cdc_core.cli import build_parser
    from cdc_core.jobs import ingest, maintain

    tasks = dag["tasks"]
    args = ingest.build_parser().parse_args(tasks["ingest"]["rendered_args"])
    assert (args.pipeline, args.env, args.once) == ("orders", "local", True)
    args = maintain.build_parser().parse_args(tasks["maintain"]["rendered_args"])
    assert (args.pipeline, args.env) == ("orders", "local")
    args = build_parser().parse_args(tasks["validate"]["rendered_command"].split()[1:])
    assert (args.command, args.pipeline, args.env) == ("validate", "orders", "local")
