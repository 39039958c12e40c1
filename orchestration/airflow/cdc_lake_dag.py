"""Airflow DAGs for cdc-lake: one per pipeline, every 15 minutes, ingest -> validate -> maintain.

    ingest    spark-submit jobs/ingest.py --pipeline NAME --env ENV --once
    validate  cdc validate --pipeline NAME --env ENV     (exit 1: silver differs from the source)
    maintain  spark-submit jobs/maintain.py --pipeline NAME --env ENV

`max_active_runs=1`: two runs of one pipeline never overlap (a late run waits). Ingest is retried
(exit 75 is transient and every stage resumes where it stopped); validate is not.

Settings come from the Airflow Variable `cdc_lake`, a JSON object whose keys are all optional
(defaults in DEFAULTS), for example `AIRFLOW_VAR_CDC_LAKE='{"pipelines": ["orders"],
"home": "/opt/cdc-lake", "spark_conn_id": "spark_cluster"}'`. `env` is also a run Param, so a
manual run can pick another environment (conf/ENV.yaml). A relative `target.root` resolves
against the worker's working directory: give absolute roots (or `lake_root`). Airflow 3 with
apache-airflow-providers-apache-spark; the file imports nothing from cdc_core.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Param, Variable

DEFAULTS: dict[str, Any] = {
    "pipelines": ["orders"],  # one DAG each: cdc_lake_<name>
    "home": str(Path(__file__).resolve().parents[2]),  # pipelines/, conf/, jobs/: this checkout
    "env": "local",  # conf/ENV.yaml; the default of the run Param `env`
    "spark_conn_id": "spark_default",  # the Spark connection: master, deploy mode, spark-submit
    "cdc_command": "cdc",  # the `cdc` command of the installed wheel
    "lake_root": "",  # LAKE_ROOT for the jobs, if set: make lake roots absolute (see below)
    "python": "",  # PYSPARK_PYTHON for spark-submit (a Python with cdc-lake installed), if set
    "schedule": "*/15 * * * *",
}


def load_settings() -> dict[str, Any]:
    """DEFAULTS overlaid with the `cdc_lake` Variable; an unknown key fails the DAG import."""
    given = Variable.get("cdc_lake", default={}, deserialize_json=True)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"Airflow Variable cdc_lake: unknown key(s) {', '.join(unknown)} "
            f"(known: {', '.join(DEFAULTS)})"
        )
    settings = {**DEFAULTS, **given}
    if isinstance(settings["pipelines"], str):
        settings["pipelines"] = [p.strip() for p in settings["pipelines"].split(",") if p.strip()]
    return settings


def job_environment(settings: dict[str, Any]) -> dict[str, str]:
    """What a job needs to find its pipeline and environment files (and its Python)."""
    env = {"CDC_HOME": settings["home"]}
    if settings["lake_root"]:
        env["LAKE_ROOT"] = settings["lake_root"]
    if settings["python"]:
        env |= {"PYSPARK_PYTHON": settings["python"], "PYSPARK_DRIVER_PYTHON": settings["python"]}
    return env


def build_dag(pipeline: str, settings: dict[str, Any]) -> DAG:
    home = settings["home"]
    env = job_environment(settings)
    common = ["--pipeline", pipeline, "--env", "{{ params.env }}"]
    with DAG(
        dag_id=f"cdc_lake_{pipeline}",
        description=f"cdc-lake pipeline {pipeline}: ingest, validate, maintain",
        schedule=settings["schedule"],
        start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        params={
            "env": Param(
                settings["env"], type="string", pattern=r"^[\w.-]+$", description="conf/ENV.yaml"
            )
        },
        default_args={"owner": "cdc-lake", "retries": 0},
        tags=["cdc-lake"],
        doc_md=__doc__,
    ) as dag:
        ingest = SparkSubmitOperator(
            task_id="ingest",
            conn_id=settings["spark_conn_id"],
            application=f"{home}/jobs/ingest.py",
            application_args=[*common, "--once"],
            env_vars=env,
            name=f"cdc-ingest-{pipeline}",
            retries=2,  # exit 75 is transient; the retry resumes from the last durable position
            retry_delay=timedelta(minutes=1),
        )
        validate = BashOperator(
            task_id="validate",
            bash_command=(
                f"{shlex.quote(settings['cdc_command'])} validate "
                f"--pipeline {shlex.quote(pipeline)} --env {{{{ params.env }}}}"
            ),
            env=env,
            append_env=True,  # keep PATH and the secrets the pipeline file reads (${VAR})
        )
        maintain = SparkSubmitOperator(
            task_id="maintain",
            conn_id=settings["spark_conn_id"],
            application=f"{home}/jobs/maintain.py",
            application_args=common,
            env_vars=env,
            name=f"cdc-maintain-{pipeline}",
            retries=1,  # a concurrent ingest commit that won on a table is transient too
            retry_delay=timedelta(minutes=1),
        )
        ingest >> validate >> maintain
    return dag


SETTINGS = load_settings()
DAGS = {name: build_dag(name, SETTINGS) for name in SETTINGS["pipelines"]}
