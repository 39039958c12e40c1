"""An expectation's regex is checked as Spark's rlike compiles it (Java's syntax, not Python's)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from cdc_core.config.validate import ColumnExpectation
from cdc_core.errors import ConfigError
from cdc_core.identifiers import TableName
from cdc_core.validate_quality import check_patterns

TABLE = TableName("public", "customers")


def expect(regex: str) -> ColumnExpectation:
    return ColumnExpectation(table=TABLE, column="name", regex=regex)


@pytest.mark.parametrize("regex", [r"^\p{Lu}[a-z]+$", r"\Q1+1\E", r"^[^@]+@[^@]+$"])
def test_java_patterns_that_python_refuses_are_taken(spark: SparkSession, regex: str) -> None:
    check_patterns(spark, [(0, expect(regex))], "pipelines/orders.yaml")
    matched = spark.createDataFrame([("Ann",), ("1+1",), ("a@b",)], "name string").where(
        f"name rlike '{regex.replace(chr(92), chr(92) * 2)}'"
    )
    assert matched.count() == 1  # and Spark itself runs them


@pytest.mark.parametrize(
    ("regex", "message"),
    [
        ("(unclosed", "'(unclosed' is not a regular expression (Java syntax, as Spark's rlike): "
         "Unclosed group near index 9"),
        ("(?P<code>[A-Z]+)", "'(?P<code>[A-Z]+)' is not a regular expression (Java syntax, as "
         "Spark's rlike): Unknown inline modifier near index 2"),
    ],
)  # fmt: skip
def test_a_pattern_java_refuses_names_the_key(
    spark: SparkSession, regex: str, message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        check_patterns(spark, [(0, expect(r"^ok$")), (1, expect(regex))], "pipelines/orders.yaml")
    assert str(e.value) == f"pipelines/orders.yaml: validate.expectations[1].regex: {message}"
    assert e.value.exit_code == 2
