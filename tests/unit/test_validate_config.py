"""The pipeline file's `validate:` section: expectations load typed, mistakes stop at load time
naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_core.config import load_pipeline
from cdc_core.identifiers import TableName
from tests.unit.test_config import CONTRACT, load_error, write_home

EXPECTATIONS = """\
validate:
  expectations:
    - {table: public.orders, column: status, in_set: [new, paid, 3]}
    - table: public.customers
      column: email
      not_null: true
      regex: '^[^@]+@[^@]+$'
      mostly: 0.99
    - {table: orders, column: total, min: 0, max: 1e6}
"""


def test_expectations_load_as_typed_entries(tmp_path: Path) -> None:
    home = write_home(tmp_path, CONTRACT + EXPECTATIONS)
    expectations = load_pipeline(
        "orders", "local", home=home, environ={}
    ).pipeline.validate.expectations

    assert [(e.table, e.column, e.checks) for e in expectations] == [
        (TableName("public", "orders"), "status", ("in_set",)),
        (TableName("public", "customers"), "email", ("not_null", "regex")),
        (TableName("public", "orders"), "total", ("min", "max")),
    ]
    assert expectations[0].in_set == ("new", "paid", "3")
    assert (expectations[1].mostly, expectations[2].min, expectations[2].max) == (0.99, "0", "1e6")


def test_a_pipeline_without_the_section_checks_nothing_extra(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert config.pipeline.validate.expectations == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{table: public.order, column: id, not_null: true}",
         "validate.expectations[0].table: public.order is not captured by this pipeline (it "
         "captures public.customers, public.orders, public.order_items) (did you mean "
         "'public.orders'?)"),
        ("{table: public.orders, column: id}",
         "validate.expectations[0].column: no check for id: add one of not_null, unique, min, "
         "max, in_set, regex"),
        ("{table: public.orders, column: id, regex: ''}",
         "validate.expectations[0].regex: the regular expression is empty"),
        ("{table: public.orders, column: id, not_null: true, mostly: 0}",
         "validate.expectations[0].mostly: 0.0 is not in (0, 1]"),
        ("{table: public.orders, column: id, min: 10, max: 1}",
         "validate.expectations[0].max: 1 is below min 10"),
        ("{table: public.orders, column: id, not_nul: true}",
         "validate.expectations[0].not_nul: unknown key (did you mean 'not_null'?)"),
    ],
)  # fmt: skip
def test_a_wrong_expectation_names_the_file_and_the_key(
    tmp_path: Path, entry: str, message: str
) -> None:
    error = load_error(tmp_path, CONTRACT + f"validate:\n  expectations:\n    - {entry}\n")
    assert error.startswith("pipelines/orders.yaml: " + message)
