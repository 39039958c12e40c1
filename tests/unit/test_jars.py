"""Jar bookkeeping: artifact names, and cache hits that need no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_core import jars


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("jackson-core-2.13.5.jar", "jackson-core"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("commons-lang3-3.17.0.jar", "commons-lang3"),
        ("delta-spark_2.13-4.3.1.jar", "delta-spark_2.13"),
        ("io.delta_delta-spark_2.13-4.3.1.jar", "delta-spark_2.13"),
        ("org.postgresql_postgresql-42.7.8.jar", "postgresql"),
    ],
)
def test_artifact_names_ignore_versions_and_ivy_prefixes(jar: str, artifact: str) -> None:
    assert jars.artifact_of(jar) == artifact


def test_delta_matches_the_installed_python_package() -> None:
    from importlib.metadata import version

    assert jars.delta_coordinate() == f"io.delta:delta-spark_2.13:{version('delta-spark')}"


def test_a_cached_resolution_is_reused_without_resolving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_JARS_DIR", str(tmp_path))
    coordinates = ["g:a:1"]
    first = tmp_path / "seed"
    first.mkdir()
    (first / "a-1.jar").write_bytes(b"jar")

    def fake_maven(coords: list[str], work: Path) -> list[Path]:
        return [first / "a-1.jar"]

    monkeypatch.setattr(jars.shutil, "which", lambda _: "/usr/bin/mvn")
    monkeypatch.setattr(jars, "_with_maven", fake_maven)
    resolved = jars.resolve(coordinates, quiet=True)
    assert [p.name for p in resolved] == ["a-1.jar"]
    manifest = json.loads((resolved[0].parent / "manifest.json").read_text())
    assert manifest["coordinates"] == coordinates

    def no_network(*_: object) -> list[Path]:
        raise AssertionError("a cached resolution must not resolve again")

    monkeypatch.setattr(jars, "_with_maven", no_network)
    monkeypatch.setattr(jars, "_with_spark_ivy", no_network)
    assert jars.resolve(coordinates, quiet=True) == resolved


def test_jars_spark_already_ships_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_home = tmp_path / "spark"
    (spark_home / "jars").mkdir(parents=True)
    (spark_home / "jars" / "jackson-core-2.20.0.jar").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    kept = jars._drop_provided_by_spark(
        [Path("jackson-core-2.13.5.jar"), Path("delta-spark_2.13-4.3.1.jar")]
    )
    assert kept == [Path("delta-spark_2.13-4.3.1.jar")]


def test_hadoop_aws_follows_the_hadoop_client_spark_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "hadoop-client-api-3.4.2.jar").write_bytes(b"")
    (tmp_path / "jars" / "hadoop-client-runtime-3.4.2.jar").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert jars.hadoop_aws_coordinate() == "org.apache.hadoop:hadoop-aws:3.4.2"
    assert jars.with_hadoop_aws(["a:b:1"]) == ["a:b:1", "org.apache.hadoop:hadoop-aws:3.4.2"]
    listed = ["org.apache.hadoop:hadoop-aws:3.4.2", "a:b:1"]
    assert jars.with_hadoop_aws(listed) == listed  # not twice
    with pytest.raises(jars.SetupError, match=r"hadoop-aws:3\.4\.3.*Hadoop 3\.4\.2"):
        jars.with_hadoop_aws(["org.apache.hadoop:hadoop-aws:3.4.3"])
    (tmp_path / "jars" / "hadoop-client-api-3.4.2.jar").unlink()
    with pytest.raises(jars.SetupError, match="hadoop-client-api"):
        jars.hadoop_aws_coordinate()


def test_the_installed_pyspark_names_its_hadoop() -> None:
    assert jars.hadoop_version().count(".") == 2


def test_s3a_adds_the_connector_only_when_used() -> None:
    from types import MappingProxyType

    from cdc_core.config import SparkSettings
    from cdc_core.spark import coordinates_for, uses_s3a

    plain = SparkSettings()
    s3a = SparkSettings(conf=MappingProxyType({"spark.hadoop.fs.s3a.endpoint": "http://h:1"}))
    aws = jars.hadoop_aws_coordinate()
    assert not uses_s3a(plain)
    assert not uses_s3a(plain, "/lake")
    assert uses_s3a(plain, "s3a://bucket/p")
    assert uses_s3a(s3a)
    assert aws not in coordinates_for(plain, "/lake")
    assert coordinates_for(plain, "s3a://bucket/p") == [*jars.default_coordinates(), aws]
    assert coordinates_for(s3a) == coordinates_for(plain, "s3a://bucket/p")  # one cache entry
