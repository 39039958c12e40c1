"""databricks.yml: a well-formed bundle whose job validates against the typed bundle classes
(databricks-bundles, generated from the bundle JSON schema) and runs entry points that exist."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import tomllib
from databricks.bundles.jobs import Job
from packaging.requirements import Requirement

from cdc_core.config.loader import read_yaml
from tests.ecosystem.conftest import ROOT

BUNDLE = ROOT / "databricks.yml"
# The bundle schema's top-level and target properties (`databricks bundle schema`).
ROOT_KEYS = {
    "artifacts", "bundle", "experimental", "include", "permissions", "presets", "python",
    "resources", "run_as", "scripts", "sync", "targets", "variables", "workspace",
}  # fmt: skip
TARGET_KEYS = {
    "artifacts", "bundle", "cluster_id", "compute_id", "default", "git", "mode", "permissions",
    "presets", "resources", "run_as", "sync", "variables", "workspace",
}  # fmt: skip
VARIABLE_KEYS = {"default", "description", "lookup", "type"}
# What every Databricks Runtime already has; the job installs the rest of the dependencies.
PROVIDED_BY_DATABRICKS = {"pyspark", "delta-spark", "pyarrow", "pandas", "pyyaml"}
JOB_PARAMETER = re.compile(r"\{\{job\.parameters\.(\w+)\}\}")
VARIABLE = re.compile(r"\$\{var\.(\w+)\}")


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    return read_yaml(BUNDLE, "databricks.yml")  # duplicate keys are errors here too


@pytest.fixture(scope="module")
def job(bundle: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = bundle["resources"]["jobs"]["cdc_lake"]
    return found


@pytest.fixture(scope="module")
def job_parameters(bundle: dict[str, Any], job: dict[str, Any]) -> dict[str, str]:
    """The job parameters' defaults, with the bundle variables' defaults put in."""
    variables = {name: str(v["default"]) for name, v in bundle["variables"].items()}
    return {p["name"]: VARIABLE.sub(lambda m: variables[m[1]], p["default"]) for p in job["parameters"]}  # fmt: skip


def tasks(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["task_key"]: t for t in job["tasks"]}


def command_line(task: dict[str, Any], job_parameters: dict[str, str]) -> list[str]:
    """The task's parameters as the job passes them, with the parameters' defaults."""
    args = task["spark_python_task"]["parameters"]
    return [JOB_PARAMETER.sub(lambda m: job_parameters[m[1]], a) for a in args]


def test_the_bundle_has_only_known_top_level_and_target_keys(bundle: dict[str, Any]) -> None:
    assert set(bundle) <= ROOT_KEYS, set(bundle) - ROOT_KEYS
    assert bundle["bundle"]["name"] == "cdc-lake"
    for name, target in bundle["targets"].items():
        assert set(target) <= TARGET_KEYS, (name, set(target) - TARGET_KEYS)
        assert target.get("mode") in (None, "development", "production")
    assert [n for n, t in bundle["targets"].items() if t.get("default")] == ["dev"]
    for name, variable in bundle["variables"].items():
        assert set(variable) <= VARIABLE_KEYS, (name, set(variable) - VARIABLE_KEYS)


def test_every_variable_used_is_declared_and_every_declared_one_used(
    bundle: dict[str, Any],
) -> None:
    text = BUNDLE.read_text()
    used = set(re.findall(r"\$\{var\.(\w+)\}", text))
    assert used == set(bundle["variables"])


def test_every_job_validates_against_the_typed_bundle_classes(bundle: dict[str, Any]) -> None:
    for name, job in bundle["resources"]["jobs"].items():
        parsed = Job.from_dict(job)  # unknown fields, wrong types, missing required keys raise
        assert parsed.tasks, name


def test_ingest_then_validate_then_maintain_on_one_job_cluster(job: dict[str, Any]) -> None:
    by_key = tasks(job)
    assert list(by_key) == ["ingest", "validate", "maintain"]
    assert "depends_on" not in by_key["ingest"]
    assert by_key["validate"]["depends_on"] == [{"task_key": "ingest"}]
    assert by_key["maintain"]["depends_on"] == [{"task_key": "validate"}]
    clusters = [c["job_cluster_key"] for c in job["job_clusters"]]
    assert clusters == ["cdc"]
    assert {t["job_cluster_key"] for t in by_key.values()} == {"cdc"}


def test_runs_every_15_minutes_and_never_two_at_once(job: dict[str, Any]) -> None:
    assert job["schedule"]["quartz_cron_expression"] == "0 0/15 * * * ?"
    assert job["max_concurrent_runs"] == 1


def test_every_python_file_is_a_job_entry_of_the_repository(job: dict[str, Any]) -> None:
    files = {k: t["spark_python_task"]["python_file"] for k, t in tasks(job).items()}
    assert files == {k: f"jobs/{k}.py" for k in ("ingest", "validate", "maintain")}
    for path in files.values():
        assert (BUNDLE.parent / path).is_file(), path


def test_the_cluster_finds_the_synced_pipeline_and_environment_files(
    job: dict[str, Any], job_parameters: dict[str, str]
) -> None:
    env = job["job_clusters"][0]["new_cluster"]["spark_env_vars"]
    assert env["CDC_HOME"] == "${workspace.file_path}"
    assert (ROOT / "conf" / "databricks.yaml").is_file()
    assert (ROOT / "pipelines" / f"{job_parameters['pipeline']}.yaml").is_file()


def test_ingest_and_maintain_arguments_parse_with_the_job_parsers(
    job: dict[str, Any], job_parameters: dict[str, str]
) -> None:
    from cdc_core.jobs import ingest, maintain

    by_key = tasks(job)
    args = ingest.build_parser().parse_args(command_line(by_key["ingest"], job_parameters))
    assert (args.pipeline, args.env, args.once, args.continuous) == ("orders", "databricks", True, False)  # fmt: skip
    args = maintain.build_parser().parse_args(command_line(by_key["maintain"], job_parameters))
    assert (args.pipeline, args.env) == ("orders", "databricks")


def test_validate_arguments_parse_with_cdc_validate(
    job: dict[str, Any], job_parameters: dict[str, str]
) -> None:
    from cdc_core.cli import build_parser

    line = command_line(tasks(job)["validate"], job_parameters)
    args = build_parser().parse_args(["validate", *line])
    assert (args.pipeline, args.env) == ("orders", "databricks"), shlex.join(line)


def test_every_task_installs_the_dependencies_the_runtime_lacks(job: dict[str, Any]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {}
    for spec in project["dependencies"]:
        req = Requirement(spec)
        if req.name.lower() not in PROVIDED_BY_DATABRICKS:
            needed[req.name.lower()] = str(req)
    for key, task in tasks(job).items():
        installed = {}
        for library in task.get("libraries", []):
            req = Requirement(library["pypi"]["package"])
            installed[req.name.lower()] = str(req)
        assert installed == needed, f"task {key}: pyproject.toml dependencies changed?"
