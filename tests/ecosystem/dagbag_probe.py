"""Run by .venv-airflow's Python, not collected by pytest: load the DAG folder into a DagBag once
per value of the `cdc_lake` Variable given, and print what each bag holds as JSON."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from airflow.dag_processing.dagbag import DagBag

TASK_FIELDS = ("application", "application_args", "env_vars", "name", "bash_command", "env")


def describe_task(task: Any, render: Any) -> dict[str, Any]:
    out = {
        "operator": type(task).__name__,
        "upstream": sorted(task.upstream_task_ids),
        "downstream": sorted(task.downstream_task_ids),
        "retries": task.retries,
        "conn_id": getattr(task, "_conn_id", None),
    }
    for field in TASK_FIELDS:
        if hasattr(task, field):
            out[field] = getattr(task, field)
    if "application_args" in out:
        out["rendered_args"] = [render(a) for a in out["application_args"]]
    if "bash_command" in out:
        out["rendered_command"] = render(out["bash_command"])
    return out


def describe(dag: Any) -> dict[str, Any]:
    params = dag.params.dump()
    jinja = dag.get_template_env()

    def render(text: str) -> str:
        return str(jinja.from_string(text).render(params=params))

    return {
        "schedule": str(dag.schedule),
        "max_active_runs": dag.max_active_runs,
        "catchup": dag.catchup,
        "params": params,
        "param_schemas": {k: dag.params.get_param(k).schema for k in params},
        "tasks": {t.task_id: describe_task(t, render) for t in dag.tasks},
    }


def main(folder: str, variables: list[Any]) -> list[dict[str, Any]]:
    bags = []
    for value in variables:
        os.environ.pop("AIRFLOW_VAR_CDC_LAKE", None)
        if value is not None:
            os.environ["AIRFLOW_VAR_CDC_LAKE"] = json.dumps(value)
        bag = DagBag(folder)
        bags.append(
            {
                "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
                "dags": {dag_id: describe(dag) for dag_id, dag in bag.dags.items()},
            }
        )
    return bags


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2])), default=str))
