"""Loading pipeline and environment files: the contract keys, interpolation, and errors that say the fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cdc_core.config import load_env, load_pipeline
from cdc_core.config.model import KeyColumns, Statements
from cdc_core.errors import ConfigError
from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.pg.pgoutput import ReplicaIdentity

CONTRACT = """\
name: orders
source:
  dsn: ${ORDERS_PG_DSN:-postgresql://postgres@127.0.0.1:5432/shop}
  slot: orders_cdc            # created if missing
  publication: orders_cdc     # created if missing (filtered to the tables below)
  tables: [public.customers, public.orders, public.order_items]
snapshot:
  mode: initial               # initial | always | initial_only | no_data | when_needed
target:
  root: ${LAKE_ROOT:-./lake}/orders
"""

LOCAL = """\
spark:
  master: local[2]
  conf:
    spark.sql.shuffle.partitions: 4
"""


def write_home(
    tmp_path: Path, pipeline: str = CONTRACT, env: str = LOCAL, name: str = "orders"
) -> Path:
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(pipeline))
    (tmp_path / "conf" / "local.yaml").write_text(textwrap.dedent(env))
    return tmp_path


def load_error(tmp_path: Path, pipeline: str, environ: dict[str, str] | None = None) -> str:
    home = write_home(tmp_path, pipeline)
    with pytest.raises(ConfigError) as e:
        load_pipeline("orders", "local", home=home, environ=environ or {})
    assert e.value.exit_code == 2
    message = str(e.value)
    assert "\n" not in message, "a configuration error is one line"
    return message


def test_the_design_contract_loads_exactly_as_written(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    p = config.pipeline
    assert p.name == "orders"
    assert p.source.dsn.conninfo == "postgresql://postgres@127.0.0.1:5432/shop"
    assert p.source.slot == "orders_cdc"
    assert p.source.publication == "orders_cdc"
    assert p.source.tables == (
        TableName("public", "customers"),
        TableName("public", "orders"),
        TableName("public", "order_items"),
    )
    assert p.snapshot.mode == "initial"
    assert p.target.root == str(Path.cwd() / "lake" / "orders")
    assert config.env.spark.master == "local[2]"
    assert dict(config.env.spark.conf) == {"spark.sql.shuffle.partitions": "4"}


def test_environment_variables_replace_defaults(tmp_path: Path) -> None:
    environ = {"ORDERS_PG_DSN": "postgresql://u:secret@db:5433/shop", "LAKE_ROOT": "/data/lake"}
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ=environ)
    assert config.pipeline.source.dsn.conninfo == environ["ORDERS_PG_DSN"]
    assert config.pipeline.target.root == "/data/lake/orders"


def test_an_empty_variable_falls_back_to_its_default(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={"LAKE_ROOT": ""})
    assert config.pipeline.target.root == str(Path.cwd() / "lake" / "orders")


def test_s3a_roots_are_kept_and_other_object_stores_refused(tmp_path: Path) -> None:
    """s3a:// is the lake on S3 (staging and state through pyarrow, Delta through Spark's s3a);
    a file system the driver cannot write its own files to is refused, naming what to use."""
    config = load_pipeline(
        "orders", "local", home=write_home(tmp_path), environ={"LAKE_ROOT": "s3a://bucket/lake/"}
    )
    assert config.pipeline.target.root == "s3a://bucket/lake/orders"
    for root, hint in (
        (
            "abfss://c@account.dfs.core.windows.net/lake",
            "the abfss: file system is not supported.",
        ),
        ("s3://bucket/lake", "(write s3a:// for S3: Spark's s3a connector)"),
    ):
        with pytest.raises(ConfigError) as e:
            load_pipeline("orders", "local", home=write_home(tmp_path), environ={"LAKE_ROOT": root})
        message = str(e.value)
        assert message.startswith("pipelines/orders.yaml: target.root: ")
        assert hint in message
        assert "Use a local path, a mounted one" in message
    with pytest.raises(ConfigError, match="name a bucket"):
        load_pipeline("orders", "local", home=write_home(tmp_path, CONTRACT.replace(
            "${LAKE_ROOT:-./lake}/orders", "s3a://")), environ={})  # fmt: skip


def test_file_uri_roots_are_local_paths(tmp_path: Path) -> None:
    for root in ("file:///data/lake", "file:/data/lake", "file://localhost/data/lake"):
        config = load_pipeline(
            "orders", "local", home=write_home(tmp_path), environ={"LAKE_ROOT": root}
        )
        assert config.pipeline.target.root == "/data/lake/orders"
    message = load_error(tmp_path, CONTRACT, {"LAKE_ROOT": "file://nas/data/lake"})
    assert "a file: URI names a path on this machine (file:///path), not on host 'nas'" in message


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("dbfs:/mnt/lake", "dbfs:/mnt/lake/orders: the dbfs: file system is not supported (on "
         "Databricks, use a volume /Volumes/... or the /dbfs/... mount)"),
        ("s3a:/bucket/lake", "s3a:/bucket/lake/orders: an S3 location has two slashes: "
         "s3a://bucket/prefix"),
        ("S3:/bucket", "the s3: file system is not supported (write s3a:// for S3"),
        ("gs://bucket/lake", "the gs: file system is not supported. Use a local path"),
    ],
)  # fmt: skip
def test_a_uri_with_one_slash_is_not_taken_for_a_local_path(
    tmp_path: Path, root: str, message: str
) -> None:
    """`dbfs:/x` is a URI, not a directory named `dbfs:` under the working directory (the lake
    would land on the driver's local disk)."""
    assert message in load_error(tmp_path, CONTRACT, {"LAKE_ROOT": root})


def test_a_colon_inside_a_local_path_keeps_it_a_path(tmp_path: Path) -> None:
    for root, expected in (
        ("./a:/b", Path.cwd() / "a:" / "b"),
        ("lake:2024", Path.cwd() / "lake:2024"),
    ):
        config = load_pipeline(
            "orders", "local", home=write_home(tmp_path), environ={"LAKE_ROOT": root}
        )
        assert config.pipeline.target.root == str(expected / "orders")


def test_dollar_dollar_is_a_literal_dollar(tmp_path: Path) -> None:
    pipeline = CONTRACT.replace("${LAKE_ROOT:-./lake}/orders", "/lake/$$x")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.target.root == "/lake/$x"


def test_dollar_dollar_is_read_once_in_an_optional_key(tmp_path: Path) -> None:
    pipeline = CONTRACT.replace("  tables:", "  heartbeat.action.query: SELECT '$${x}'\n  tables:")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.heartbeat_action_query == "SELECT '${x}'"


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("  slot: orders_cdc", "  slott: orders_cdc"))
    assert message.startswith("pipelines/orders.yaml: source.slott: unknown key")
    assert "did you mean 'slot'?" in message


def test_unknown_top_level_section_is_named(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT + "snapshots:\n  mode: initial\n")
    assert message.startswith(
        "pipelines/orders.yaml: snapshots: unknown key (did you mean 'snapshot'?)"
    )


def test_wrong_enum_value_lists_the_choices_and_suggests(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("mode: initial ", "mode: inital "))
    assert message == (
        "pipelines/orders.yaml: snapshot.mode: 'inital' is not one of initial, always, "
        "initial_only, no_data, when_needed (did you mean 'initial'?)"
    )


@pytest.mark.parametrize(
    ("value", "got"),
    [("[initial]", "a list"), ("{initial: 1}", "a mapping"), ("", "nothing (null)")],
)
def test_a_choice_given_as_a_list_a_mapping_or_nothing_says_so(
    tmp_path: Path, value: str, got: str
) -> None:
    message = load_error(tmp_path, CONTRACT.replace("mode: initial ", f"mode: {value} "))
    assert message == (
        "pipelines/orders.yaml: snapshot.mode: expected one of initial, always, initial_only, "
        f"no_data, when_needed, got {got}"
    )


def test_a_choice_is_taken_in_any_case_as_debezium_parses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = write_home(tmp_path, CONTRACT.replace("mode: initial ", "mode: When_Needed "))
    assert load_pipeline("orders", "local", home=home, environ={}).pipeline.snapshot.mode == (
        "when_needed"
    )
    home = write_home(tmp_path, CONTRACT.replace("mode: initial ", "mode: NEVER "))
    assert load_pipeline("orders", "local", home=home, environ={}).pipeline.snapshot.mode == (
        "no_data"
    )
    assert "'NEVER' is deprecated, use 'no_data'" in caplog.text


def test_never_is_a_deprecated_alias_of_no_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = write_home(tmp_path, CONTRACT.replace("mode: initial ", "mode: never "))
    config = load_pipeline("orders", "local", home=home, environ={})
    assert config.pipeline.snapshot.mode == "no_data"
    assert "'never' is deprecated, use 'no_data'" in caplog.text


def test_missing_required_key_is_named_with_an_example(tmp_path: Path) -> None:
    message = load_error(
        tmp_path, CONTRACT.replace("  slot: orders_cdc            # created if missing\n", "")
    )
    assert message == (
        "pipelines/orders.yaml: source.slot: required key is missing (add it, for example slot: orders_cdc)"
    )


def test_missing_required_section_is_named(tmp_path: Path) -> None:
    without_target = CONTRACT.split("target:", maxsplit=1)[0]
    message = load_error(tmp_path, without_target)
    assert message.startswith("pipelines/orders.yaml: target: required key is missing")


def test_undefined_variable_without_default_is_named(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        CONTRACT.replace(
            "${ORDERS_PG_DSN:-postgresql://postgres@127.0.0.1:5432/shop}", "${SHOP_DSN}"
        ),
    )
    assert message == (
        "pipelines/orders.yaml: source.dsn: ${SHOP_DSN} is not set and has no default "
        "(export SHOP_DSN=... or write ${SHOP_DSN:-default})"
    )


def test_a_default_holding_another_variable_is_refused_not_kept_as_text(tmp_path: Path) -> None:
    """`${LAKE_ROOT:-${HOME}/lake}` ended at the inner `}`: the root became `${HOME/lake}`."""
    message = load_error(
        tmp_path, CONTRACT.replace("${LAKE_ROOT:-./lake}", "${LAKE_ROOT:-${HOME}/lake}")
    )
    assert message == (
        "pipelines/orders.yaml: target.root: the default of ${LAKE_ROOT} holds another '${...}' "
        "in '${LAKE_ROOT:-${HOME}/lake}/orders': defaults are plain text, not nested"
    )


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("  slot: orders_cdc", "  slot: [orders_cdc"))
    assert message.startswith("pipelines/orders.yaml:5:")
    assert "malformed YAML" in message


def test_duplicate_keys_are_rejected_not_silently_overwritten(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT + "name: other\n")
    assert message.startswith("pipelines/orders.yaml:11:1: malformed YAML: duplicate key 'name'")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("snapshot:\n  ? [mode]\n  : initial\n", ":10:5: malformed YAML: a key is a single value, "
         "not a list"),
        ("snapshot: {{mode: x}: initial}\n", ":9:12: malformed YAML: a key is a single value, "
         "not a mapping"),
    ],
)  # fmt: skip
def test_a_list_or_mapping_as_a_key_is_malformed_yaml(
    tmp_path: Path, text: str, message: str
) -> None:
    pipeline = CONTRACT.replace("snapshot:\n  mode: initial               # initial | always | "
                                "initial_only | no_data | when_needed\n", "")  # fmt: skip
    assert "snapshot" not in pipeline
    assert load_error(tmp_path, pipeline + text) == "pipelines/orders.yaml" + message


def test_yaml_merge_keys_merge_and_the_mapping_own_keys_win(tmp_path: Path) -> None:
    """`<<: *anchor` is standard YAML (1.1): the merged keys come first, the mapping's own win;
    a key written twice in the mapping itself is still a duplicate."""
    pipeline = CONTRACT + textwrap.dedent("""\
        validate:
          expectations:
            - &id {table: public.orders, column: id, not_null: true, mostly: 0.5}
            - <<: *id
              column: customer_id
              mostly: 0.9
        """)
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    first, second = config.pipeline.validate.expectations
    assert (second.table, second.column, second.not_null, second.mostly) == (
        first.table,
        "customer_id",
        True,
        0.9,
    )
    message = load_error(tmp_path, pipeline + "      column: status\n")
    assert "malformed YAML: duplicate key 'column'" in message


def test_pipeline_name_with_no_file_lists_what_exists(tmp_path: Path) -> None:
    home = write_home(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_pipeline("order", "local", home=home, environ={})
    assert str(e.value) == (
        "pipelines/order.yaml: no such pipeline file (available: orders) (did you mean 'orders'?)"
    )
    assert e.value.exit_code == 2


def test_environment_with_no_file_lists_what_exists(tmp_path: Path) -> None:
    home = write_home(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_pipeline("orders", "prod", home=home, environ={})
    assert str(e.value) == "conf/prod.yaml: no such environment file (available: local)"


def test_name_must_match_the_file(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("name: orders", "name: shop"))
    assert message.startswith(
        "pipelines/orders.yaml: name: 'shop' does not match the file name 'orders'"
    )


def test_invalid_slot_name_says_what_is_allowed(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("slot: orders_cdc", "slot: Orders-CDC"))
    assert message.startswith(
        "pipelines/orders.yaml: source.slot: 'Orders-CDC' is not a valid replication slot name"
    )


def test_wrong_type_is_named(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        CONTRACT.replace(
            "  tables: [public.customers, public.orders, public.order_items]",
            "  tables: public.customers",
        ),
    )
    assert (
        message
        == "pipelines/orders.yaml: source.tables: expected a list, got str 'public.customers'"
    )


def test_bad_table_name_is_named_with_its_index(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("public.orders,", "'public.Order Items',"))
    assert message.startswith(
        "pipelines/orders.yaml: source.tables[1]: 'public.Order Items' is not a valid name"
    )
    assert 'public."Order Items"' in message


def test_quoted_table_names_keep_case_spaces_and_dots(tmp_path: Path) -> None:
    pipeline = CONTRACT.replace(
        "[public.customers, public.orders, public.order_items]",
        """['"Sales"."Order Items"', '"a.b"', Public.Mixed]""",
    )
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.tables == (
        TableName("Sales", "Order Items"),
        TableName("public", "a.b"),
        TableName("public", "mixed"),
    )


def test_duplicate_tables_are_rejected(tmp_path: Path) -> None:
    message = load_error(tmp_path, CONTRACT.replace("public.order_items]", "public.orders]"))
    assert message == "pipelines/orders.yaml: source.tables: public.orders is listed twice"


def test_tables_that_would_share_bronze_rows_are_rejected(tmp_path: Path) -> None:
    message = load_error(
        tmp_path, CONTRACT.replace("public.order_items]", "'\"a.b\".c', 'a.\"b.c\"']")
    )
    assert message == (
        'pipelines/orders.yaml: source.tables: "a.b".c and a."b.c" are both a.b.c in bronze '
        "(source.table, as Debezium writes it): capture one of them, or rename one in PostgreSQL"
    )


@pytest.mark.parametrize("name", ['".."', '"."', 'public."../../bronze"', '"a/b".c'])
def test_names_that_are_no_directory_of_the_lake_are_rejected(tmp_path: Path, name: str) -> None:
    message = load_error(tmp_path, CONTRACT.replace("public.order_items]", f"'{name}']"))
    assert "cannot be a directory of the lake (silver/<schema>/<table>)" in message


def test_environment_file_errors_name_the_environment_file(tmp_path: Path) -> None:
    home = write_home(tmp_path, env="spark:\n  jars: maybe\n")
    with pytest.raises(ConfigError) as e:
        load_pipeline("orders", "local", home=home, environ={})
    assert str(e.value) == "conf/local.yaml: spark.jars: 'maybe' is not one of resolve, provided"


def test_spark_conf_keys_must_be_spark_settings(tmp_path: Path) -> None:
    home = write_home(tmp_path, env="spark:\n  conf:\n    shuffle.partitions: 4\n")
    with pytest.raises(ConfigError) as e:
        load_env("local", home=home, environ={})
    assert str(e.value).startswith(
        "conf/local.yaml: spark.conf: 'shuffle.partitions' is not a Spark setting"
    )


@pytest.mark.parametrize(
    ("database", "message"),
    [
        ("cdc_{schem}", "catalog.database: 'cdc_{schem}': unknown placeholder {schem}; the only "
         "one is {schema}"),
        ("cdc_{0}", "unknown placeholder {0}"),
        ("cdc_{schema!r}", "unknown placeholder {schema!r}"),
        ("cdc_{schema", "'cdc_{schema': expected '}' before end of string (write {{ and }} for a "
         "literal brace)"),
    ],
)  # fmt: skip
def test_a_catalog_database_template_is_checked_when_it_loads(
    tmp_path: Path, database: str, message: str
) -> None:
    """Not in the middle of a batch, after bronze is written (`str.format` raising KeyError)."""
    home = write_home(tmp_path, env=f"catalog:\n  register: true\n  database: '{database}'\n")
    with pytest.raises(ConfigError) as e:
        load_env("local", home=home, environ={})
    assert str(e.value).startswith("conf/local.yaml: ")
    assert message in str(e.value)
    home = write_home(tmp_path, env="catalog:\n  database: 'mirror_{schema}_{{x}}'\n")
    assert load_env("local", home=home, environ={})[0].catalog.database == "mirror_{schema}_{{x}}"


@pytest.mark.parametrize(
    ("tables", "database", "message"),
    [
        ("[public.orders, sales.orders]", "cdc", "'cdc' registers public.orders and sales.orders "
         "under one name, cdc.orders (Spark's catalog ignores case, and holds other characters than "
         "letters, digits and _ as _): put {schema} in it"),
        ('[public.orders, \'public."Orders"\']', "cdc_{schema}", "'cdc_{schema}' registers "
         "public.orders and public.\"Orders\" under one name, cdc_public.orders (Spark's catalog "
         "ignores case, and holds other characters than letters, digits and _ as _): register "
         "one of them by hand, or leave one out of the pipeline"),
        ('[public.orders, \'"Public".orders\']', "cdc_{schema}", "cdc_public.orders"),
        ('[\'public."Order Items"\', public.order_items]', "cdc_{schema}",
         "cdc_public.order_items"),
        ('[\'"Sales Dept".orders\', sales_dept.orders]', "cdc_{schema}", "cdc_sales_dept.orders"),
    ],
)  # fmt: skip
def test_two_mirrors_registered_under_one_catalog_name_are_refused(
    tmp_path: Path, tables: str, database: str, message: str
) -> None:
    """`CREATE TABLE IF NOT EXISTS` would leave the second one unregistered, silently."""
    pipeline = CONTRACT.replace("[public.customers, public.orders, public.order_items]", tables)
    env = f"catalog:\n  register: true\n  database: '{database}'\n"
    home = write_home(tmp_path, pipeline, env)
    with pytest.raises(ConfigError) as e:
        load_pipeline("orders", "local", home=home, environ={})
    assert str(e.value).startswith("conf/local.yaml: catalog.database: ")
    assert message in str(e.value)
    unregistered = f"catalog:\n  register: false\n  database: '{database}'\n"
    home = write_home(tmp_path, pipeline, unregistered)
    assert len(load_pipeline("orders", "local", home=home, environ={}).pipeline.source.tables) == 2


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "'1e999'", "'nan'"])
def test_a_number_that_is_not_finite_is_refused(tmp_path: Path, value: str) -> None:
    """`age >= nan` is never true (the metrics table would never be appended again), and
    `sleep(inf)` overflows."""
    for key in ("trigger_interval_s", "metrics_table_interval_s", "retry_backoff_s"):
        message = load_error(tmp_path, CONTRACT + f"capture:\n  {key}: {value}\n")
        assert f"capture.{key}: expected a finite number, got " in message


def test_a_negative_retry_wait_is_refused(tmp_path: Path) -> None:
    """Else the first transient failure ends the run with `sleep length must be non-negative`."""
    message = load_error(tmp_path, CONTRACT + "capture:\n  retry_backoff_s: -5\n")
    assert message.endswith("capture.retry_backoff_s: -5.0 is negative")


def test_snapshot_lock_timeout_loads_and_must_be_positive(tmp_path: Path) -> None:
    """Debezium's snapshot.lock.timeout.ms; 0 would be PostgreSQL's "wait for ever"."""

    def with_timeout(ms: int) -> str:
        return CONTRACT.replace("  mode: initial", f"  lock.timeout.ms: {ms}\n  mode: initial")

    home = write_home(tmp_path, with_timeout(2500))
    snapshot = load_pipeline("orders", "local", home=home, environ={}).pipeline.snapshot
    assert snapshot.lock_timeout_ms == 2500
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert default.pipeline.snapshot.lock_timeout_ms == 10_000  # Debezium's default
    message = load_error(tmp_path, with_timeout(0))
    assert message.endswith("snapshot.lock.timeout.ms: 0 must be at least 1"), message


def test_snapshot_tables_order_takes_debeziums_three_values_and_names_them(tmp_path: Path) -> None:
    def with_order(order: str) -> str:
        return CONTRACT.replace(
            "  mode: initial", f"  tables.order.by.row.count: {order}\n  mode: initial"
        )

    home = write_home(tmp_path, with_order("descending"))
    snapshot = load_pipeline("orders", "local", home=home, environ={}).pipeline.snapshot
    assert snapshot.tables_order_by_row_count == "descending"
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert default.pipeline.snapshot.tables_order_by_row_count == "disabled"
    message = load_error(tmp_path, with_order("biggest"))
    assert message.endswith(
        "snapshot.tables.order.by.row.count: 'biggest' is not one of disabled, ascending, "
        "descending"
    ), message


def test_guardrail_collections_loads_with_debeziums_defaults_and_no_negative_limit(
    tmp_path: Path,
) -> None:
    def with_guardrail(lines: str) -> str:
        return CONTRACT.replace("snapshot:", f"{lines}snapshot:")

    guarded = with_guardrail("  guardrail.collections.max: 2\n"
                             "  guardrail.collections.limit.action: fail\n")  # fmt: skip
    source = load_pipeline("orders", "local", home=write_home(tmp_path, guarded), environ={})
    assert (source.pipeline.source.guardrail_collections_max,
            source.pipeline.source.guardrail_collections_limit_action) == (2, "fail")  # fmt: skip
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert (default.pipeline.source.guardrail_collections_max,
            default.pipeline.source.guardrail_collections_limit_action) == (0, "warn")  # fmt: skip
    message = load_error(tmp_path, with_guardrail("  guardrail.collections.max: -1\n"))
    assert message.endswith("source.guardrail.collections.max: -1 is negative: give the most "
                            "tables to capture, or 0 for no limit"), message  # fmt: skip
    message = load_error(tmp_path, with_guardrail("  guardrail.collections.limit.action: x\n"))
    assert message.endswith("'x' is not one of warn, fail"), message


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        ("SET work_mem = '64MB'; SET search_path = app", ["SET work_mem = '64MB'",
                                                          "SET search_path = app"]),
        ("SET application_name = 'a;;b';", ["SET application_name = 'a;b'"]),
        (" ; ;SELECT 1;", ["SELECT 1"]),
        (";;;", [";"]),  # Debezium's parser: the escape, then a delimiter
        # a Debezium user's statement, as written in a connector's configuration
        ("DO $$BEGIN IF NOT EXISTS(SELECT FROM pg_publication) THEN CREATE PUBLICATION p;; "
         "END IF;; END$$;", ["DO $$BEGIN IF NOT EXISTS(SELECT FROM pg_publication) THEN "
                             "CREATE PUBLICATION p; END IF; END$$"]),
    ],
)  # fmt: skip
def test_initial_statements_split_as_debezium_splits_them(text: str, statements: list[str]) -> None:
    parsed = Statements.parse(text)
    assert list(parsed.items) == statements
    assert Statements.parse(str(parsed)) == parsed  # written back as it reads


def test_initial_statements_load_from_a_string_or_a_list_into_the_connection(
    tmp_path: Path,
) -> None:
    def with_statements(value: str) -> str:
        return CONTRACT.replace("snapshot:", f"  database.initial.statements: {value}\nsnapshot:")

    for value in ('"SET a.b = \'x;;y\'; SET work_mem = 1024"',
                  "[\"SET a.b = 'x;y'\", SET work_mem = 1024]"):  # fmt: skip
        home = write_home(tmp_path, with_statements(value))
        source = load_pipeline("orders", "local", home=home, environ={}).pipeline.source
        assert source.dsn.initial_statements == ("SET a.b = 'x;y'", "SET work_mem = 1024")
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert default.pipeline.source.dsn.initial_statements == ()


def test_retries_take_minus_one_for_no_limit_and_nothing_below(tmp_path: Path) -> None:
    home = write_home(tmp_path, CONTRACT + "capture:\n  retries: -1\n")
    unlimited = load_pipeline("orders", "local", home=home, environ={}).pipeline.capture
    assert (unlimited.gives_up(1), unlimited.gives_up(10_000)) == (False, False)
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert [default.pipeline.capture.gives_up(n) for n in (5, 6)] == [False, True]
    message = load_error(tmp_path, CONTRACT + "capture:\n  retries: -2\n")
    assert message.endswith("capture.retries: -2 must be 0 or more, or -1 (no limit)")


def test_booleans_from_environment_variables(tmp_path: Path) -> None:
    home = write_home(tmp_path, env="catalog:\n  register: ${REGISTER:-false}\n")
    settings, _ = load_env("local", home=home, environ={"REGISTER": "true"})
    assert settings.catalog.register is True


def test_the_passwords_of_a_dsn_never_print(tmp_path: Path) -> None:
    environ = {
        "ORDERS_PG_DSN": "postgresql://app:s3cr3t@db:5432/shop?password=other&sslmode=require"
    }
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ=environ)
    dsn = config.pipeline.source.dsn
    shown = f"{dsn} {dsn!r} {config!r}"
    assert "s3cr3t" not in shown
    assert "other" not in shown
    assert "postgresql://app:***@db:5432/shop" in shown


@pytest.mark.parametrize("secret", ["se?cret", "se#cret", "a?b#c:d"])
def test_a_uri_password_with_a_question_mark_or_hash_is_a_password(
    secret: str, tmp_path: Path
) -> None:
    """libpq reads a URI's user info up to the first `@` before any `/`: `?` and `#` are part
    of the password there, which printed in clear and passed for no password in the file."""
    uri = f"postgresql://app:{secret}@db:5432/shop?sslmode=require"
    config = load_pipeline("orders", "local", home=write_home(tmp_path),
                           environ={"ORDERS_PG_DSN": uri})  # fmt: skip
    dsn = config.pipeline.source.dsn
    assert dsn.has_password
    assert str(dsn) == "postgresql://app:***@db:5432/shop?sslmode=require"
    assert secret not in f"{dsn!r} {config!r}"
    written = CONTRACT.replace(
        "${ORDERS_PG_DSN:-postgresql://postgres@127.0.0.1:5432/shop}", f"'{uri}'"
    )
    assert written != CONTRACT
    assert "holds a password written in the file" in load_error(tmp_path, written)


def test_key_value_dsn_passwords_are_redacted(tmp_path: Path) -> None:
    environ = {"ORDERS_PG_DSN": "host=db user=app password='p w' dbname=shop"}
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ=environ)
    assert str(config.pipeline.source.dsn) == "host=db user=app password=*** dbname=shop"


def test_the_repository_pipelines_and_environments_load() -> None:
    home = Path(__file__).resolve().parents[2]
    for env in ("local", "databricks"):
        config = load_pipeline("orders", env, home=home, environ={})
        assert config.pipeline.name == "orders"


def _with_source(lines: str) -> str:
    return CONTRACT.replace("  tables: [", lines + "  tables: [")


def test_table_and_schema_filters_narrow_the_tables(tmp_path: Path) -> None:
    pipeline = _with_source("  table.exclude.list: public\\.order_.*, other\\.x\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.tables == (
        TableName("public", "customers"), TableName("public", "orders"),
    )  # fmt: skip
    pipeline = _with_source("  table.include.list: ['public\\.ord.{1,3}s', public.customers]\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.tables == (
        TableName("public", "customers"), TableName("public", "orders"),
    )  # fmt: skip
    pipeline = _with_source("  schema.include.list: sales\n")
    message = load_error(tmp_path, pipeline)
    assert "source.tables" in message
    assert "leave no table" in message


@pytest.mark.parametrize(
    ("lines", "key", "fragment"),
    [
        ("  table.include.list: a\n  table.exclude.list: b\n", "source.table.exclude.list",
         "mutually exclusive"),
        ("  schema.include.list: a\n  schema.exclude.list: b\n", "source.schema.exclude.list",
         "mutually exclusive"),
        ("  message.prefix.include.list: a\n  message.prefix.exclude.list: b\n",
         "source.message.prefix.exclude.list", "mutually exclusive"),
        ("  table.include.list: public\\.(orders\n", "source.table.include.list",
         "is not a regular expression"),
        ("  skipped.operations: c,x\n", "source.skipped.operations", "c, u, d, t"),
        ("  column.include.list: a\n  column.exclude.list: b\n", "source.column.exclude.list",
         "mutually exclusive"),
        ("  column.transforms:\n    column.mask.hash.SHA-3.with.salt.s: public.t.c\n",
         "source.column.transforms.column.mask.hash.SHA-3.with.salt.s",
         "unknown hash algorithm 'SHA-3'"),
        ("  column.transforms:\n    column.hide.it: public.t.c\n",
         "source.column.transforms.column.hide.it", "not a column transform"),
        ("  message.key.columns: public.t\n", "source.message.key.columns",
         "<schema.table regex>:<column>"),
        ("  replica.identity.autoset.values: public.t:HALF\n",
         "source.replica.identity.autoset.values", "FULL, DEFAULT, NOTHING or INDEX"),
        ("  heartbeat.interval.ms: -5\n", "source.heartbeat.interval.ms", "negative"),
        ("  column.transforms:\n    column.truncate.to.0.chars: public.t.c\n",
         "source.column.transforms.column.truncate.to.0.chars", "must be positive"),
        ("  column.transforms:\n    column.mask.with.99999999999999.chars: public.t.c\n",
         "source.column.transforms.column.mask.with.99999999999999.chars",
         "99,999,999,999,999 characters is more than a column transform takes (1,073,741,824"),
        ("  unavailable.value.placeholder: hex:5f5g\n", "source.unavailable.value.placeholder",
         "'hex:5f5g': after hex: comes hexadecimally encoded octets"),
        ("  unavailable.value.placeholder: hex:abc\n", "source.unavailable.value.placeholder",
         "two hex digits each"),
    ],
)  # fmt: skip
def test_misconfigured_filters_fail_at_load_naming_file_and_key(
    tmp_path: Path, lines: str, key: str, fragment: str
) -> None:
    message = load_error(tmp_path, _with_source(lines))
    assert "pipelines/orders.yaml" in message
    assert key in message
    assert fragment in message


def test_skipped_operations_and_message_prefixes_load(tmp_path: Path) -> None:
    pipeline = _with_source("  skipped.operations: t, d\n  message.prefix.exclude.list: audit.*\n")
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert source.pipeline.source.skipped_operations.codes == {"t", "d"}
    assert not source.pipeline.source.keeps_message("audit-1")
    assert source.pipeline.source.keeps_message("outbox")
    assert source.pipeline.source.keeps_message("xaudit")  # anchored: a whole-name match


@pytest.mark.parametrize(("text", "codes"), [("NONE", set()), ("U,T", {"u", "t"}), ("D", {"d"})])
def test_skipped_operations_are_taken_in_any_case(
    tmp_path: Path, text: str, codes: set[str]
) -> None:
    """As Debezium's: an operation code and `none` compare without case."""
    pipeline = _with_source(f"  skipped.operations: {text}\n")
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert source.pipeline.source.skipped_operations.codes == codes


def test_replica_identity_rules_match_tables_in_order(tmp_path: Path) -> None:
    pipeline = _with_source(
        "  replica.identity.autoset.values: public.orders:index  orders_uk,public.*:full\n"
    )
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    rules = source.pipeline.source.replica_identity_autoset_values
    assert rules.for_table(TableName("public", "orders")) == "INDEX orders_uk"
    assert rules.for_table(TableName("public", "customers")) == "FULL"
    assert rules.for_table(TableName("sales", "x")) is None


def test_table_and_schema_lists_match_names_in_any_case_as_in_debezium(tmp_path: Path) -> None:
    pipeline = _with_source("  table.include.list: PUBLIC\\.Orders,Public\\.CUSTOMERS\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.tables == (
        TableName("public", "customers"), TableName("public", "orders"),
    )  # fmt: skip
    assert "leave no table" in load_error(tmp_path, _with_source("  schema.exclude.list: PUBLIC\n"))


def test_an_escaped_comma_stays_inside_a_comma_separated_expression(tmp_path: Path) -> None:
    pipeline = _with_source("  table.include.list: public\\.ord.{1\\,3}s,public\\.customers\n")
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert source.pipeline.source.table_include_list.patterns == (
        r"public\.ord.{1,3}s", r"public\.customers",
    )  # fmt: skip
    assert (
        str(source.pipeline.source.table_include_list) == r"public\.ord.{1\,3}s,public\.customers"
    )
    assert source.pipeline.source.tables == (
        TableName("public", "customers"), TableName("public", "orders"),
    )  # fmt: skip


def test_column_rules_from_the_file_mask_and_drop_mixed_case_columns(tmp_path: Path) -> None:
    pipeline = _with_source(
        "  column.exclude.list: public.customers.ssn\n"
        "  column.transforms:\n    column.mask.with.4.chars: public.customers.email\n"
    )
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    columns = tuple(
        ColumnDescriptor(name, 25, -1, "text", name == "id") for name in ("id", "Email", "SSN")
    )
    customers = RelationDescriptor(
        1, 0, "public", "customers", ReplicaIdentity.DEFAULT, columns, ("id",)
    )
    plan = source.pipeline.source.column_rules().plan(customers)
    assert plan is not None
    assert plan.text({"id": "1", "Email": "ann@example.com", "SSN": "123"}) == {
        "id": "1", "Email": "****",
    }  # fmt: skip


def test_message_prefixes_keys_and_identity_rules_match_in_any_case(tmp_path: Path) -> None:
    pipeline = _with_source(
        "  message.prefix.include.list: outbox.*\n"
        "  message.key.columns: PUBLIC.ORDERS:id\n"
        "  replica.identity.autoset.values: Public.Orders:FULL\n"
    )
    source = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert source.pipeline.source.keeps_message("Outbox-1")
    assert not source.pipeline.source.keeps_message("audit")
    orders = TableName("public", "orders")
    keys = source.pipeline.source.message_key_columns
    assert keys.for_table(orders, ["ID", "total"]) == ("ID",)
    assert source.pipeline.source.replica_identity_autoset_values.for_table(orders) == "FULL"


ORDERS = TableName("public", "orders")


def test_message_key_columns_take_every_matching_entry_in_the_order_written() -> None:
    # Debezium's Key.CustomKeyMapper: each table:column pair in turn adds the columns it
    # matches, so entries for public.* and for public.orders both count.
    keys = KeyColumns.parse("public\\.orders:line;public\\..*:tenant,id")
    columns = ["id", "tenant", "line", "total"]
    assert keys.for_table(ORDERS, columns) == ("line", "tenant", "id")
    assert keys.for_table(TableName("public", "customers"), ["id", "tenant"]) == ("tenant", "id")


def test_message_key_columns_list_a_column_two_entries_name_once() -> None:
    keys = KeyColumns.parse("public.orders:id;public.*:id,tenant")
    assert keys.for_table(ORDERS, ["tenant", "id"]) == ("id", "tenant")


def test_a_message_key_column_is_a_pattern_matched_in_table_order() -> None:
    keys = KeyColumns.parse("public.orders:k.*")
    assert keys.for_table(ORDERS, ["k2", "x", "K1"]) == ("k2", "K1")


def test_a_message_key_column_the_table_lacks_is_ignored() -> None:
    keys = KeyColumns.parse("public.orders:id,nope")
    assert keys.for_table(ORDERS, ["id", "total"]) == ("id",)
    assert keys.unmatched(ORDERS, ["id", "total"]) == ["nope"]
    assert keys.unmatched(TableName("public", "other"), ["id"]) == []


def test_message_key_columns_matching_no_column_leave_the_primary_key() -> None:
    keys = KeyColumns.parse("public.orders:nope")
    assert keys.for_table(ORDERS, ["id", "total"]) is None
    assert keys.for_table(TableName("public", "customers"), ["nope"]) is None


def test_a_hex_placeholder_loads_as_written(tmp_path: Path) -> None:
    pipeline = _with_source("  unavailable.value.placeholder: hex:DEADbeef\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.source.unavailable_value_placeholder == "hex:DEADbeef"


@pytest.mark.parametrize(("digits", "fragment"), [("-1", "-1 is not between 0 and 21"),
                                                  ("22", "22 is not between 0 and 21")])  # fmt: skip
def test_money_fraction_digits_out_of_range_fail_at_load(
    tmp_path: Path, digits: str, fragment: str
) -> None:
    message = load_error(tmp_path, CONTRACT + f"silver:\n  money.fraction.digits: {digits}\n")
    assert "pipelines/orders.yaml: silver.money.fraction.digits" in message
    assert fragment in message


def test_money_fraction_digits_default_to_debeziums_two(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert config.pipeline.silver.money_fraction_digits == 2
    pipeline = CONTRACT + "silver:\n  money.fraction.digits: 0\n"
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.silver.money_fraction_digits == 0


def test_snapshot_include_collection_list_names_captured_tables(tmp_path: Path) -> None:
    def with_list(value: str) -> str:
        return CONTRACT.replace(
            "  mode: initial", f"  mode: initial\n  include.collection.list: {value}"
        )

    config = load_pipeline(
        "orders", "local", home=write_home(tmp_path, with_list("public\\.order.*")), environ={}
    )
    snapshot = config.pipeline.snapshot
    assert [t.name for t in config.pipeline.source.tables if snapshot.reads_first(t)] == [
        "orders", "order_items",
    ]  # fmt: skip
    assert not snapshot.reads_first(TableName("public", "customers"))
    assert snapshot.reads_first(TableName("PUBLIC", "ORDERS"))  # no case, as Debezium matches
    default = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert all(default.pipeline.snapshot.reads_first(t) for t in default.pipeline.source.tables)
    message = load_error(tmp_path, with_list("public.customers, public.custmers"))
    assert "pipelines/orders.yaml" in message
    assert "snapshot.include.collection.list" in message
    assert "'public.custmers' matches none of the captured tables" in message


def with_snapshot(keys: str) -> str:
    return CONTRACT.replace("snapshot:\n", f"snapshot:\n{textwrap.indent(keys, '  ')}")


def test_signals_come_from_the_source_channel_by_default(tmp_path: Path) -> None:
    snapshot = load_pipeline(
        "orders", "local", home=write_home(tmp_path), environ={}
    ).pipeline.snapshot
    assert snapshot.signal_enabled_channels.names == ("source",)
    assert snapshot.signal_file == str(tmp_path.resolve() / "pipelines" / "file-signals.txt")


@pytest.mark.parametrize("written", ["source,file", "' file , source '", "[file, source, file]"])
def test_signal_channels_load_as_a_comma_list_or_a_yaml_list(tmp_path: Path, written: str) -> None:
    pipeline = with_snapshot(f"signal.enabled.channels: {written}\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert set(config.pipeline.snapshot.signal_enabled_channels.names) == {"source", "file"}


def test_a_relative_signal_file_is_next_to_the_pipeline_file_and_an_absolute_one_kept(
    tmp_path: Path,
) -> None:
    pipeline = with_snapshot("signal.file: signals/orders.txt\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.snapshot.signal_file == str(
        tmp_path.resolve() / "pipelines" / "signals" / "orders.txt"
    )
    pipeline = with_snapshot("signal.file: /var/run/cdc/orders.signals\n")
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline), environ={})
    assert config.pipeline.snapshot.signal_file == "/var/run/cdc/orders.signals"


@pytest.mark.parametrize(
    ("written", "why"),
    [("kafka", "runs without Kafka"), ("source,jmx", "JMX MBean"), ("KAFKA", "without Kafka")],
)
def test_debeziums_kafka_and_jmx_channels_are_refused_saying_why(
    tmp_path: Path, written: str, why: str
) -> None:
    message = load_error(tmp_path, with_snapshot(f"signal.enabled.channels: {written}\n"))
    assert "pipelines/orders.yaml: snapshot.signal.enabled.channels" in message
    assert "channel is not supported" in message
    assert why in message
    assert "use source (the table of signal.data.collection) or file (signal.file)" in message


def test_an_unknown_signal_channel_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    message = load_error(tmp_path, with_snapshot("signal.enabled.channels: source,fiel\n"))
    assert "'fiel' is not a signal channel: one of source, file (did you mean 'file'?)" in message


def test_no_signal_channel_and_an_empty_signal_file_are_refused(tmp_path: Path) -> None:
    message = load_error(tmp_path, with_snapshot("signal.enabled.channels: ','\n"))
    assert "name a channel: source, file or both" in message
    message = load_error(tmp_path, with_snapshot("signal.file: ' '\n"))
    assert "snapshot.signal.file: the path is empty" in message


def test_a_change_silver_cannot_apply_fails_unless_told_otherwise(tmp_path: Path) -> None:
    config = load_pipeline("orders", "local", home=write_home(tmp_path), environ={})
    assert config.pipeline.silver.event_processing_failure_handling_mode == "fail"
    warned = CONTRACT + "silver:\n  event.processing.failure.handling.mode: warn\n"
    config = load_pipeline("orders", "local", home=write_home(tmp_path, warned), environ={})
    assert config.pipeline.silver.event_processing_failure_handling_mode == "warn"


def test_a_failure_handling_mode_debezium_lacks_is_refused_with_the_choices(
    tmp_path: Path,
) -> None:
    message = load_error(
        tmp_path, CONTRACT + "silver:\n  event.processing.failure.handling.mode: skpi\n"
    )
    assert message == (
        "pipelines/orders.yaml: silver.event.processing.failure.handling.mode: 'skpi' is not "
        "one of fail, warn, skip (did you mean 'skip'?)"
    )


def test_a_number_written_where_text_is_expected_keeps_its_text(tmp_path: Path) -> None:
    """YAML reads 0755 as the octal 493 and 1_000 as 1000: a slot or a Spark setting given
    so is what the file says, not another slot (or another number of partitions)."""
    pipeline = CONTRACT.replace("slot: orders_cdc", "slot: 0755").replace(
        "publication: orders_cdc", "publication: 1_000"
    )
    env = LOCAL.replace("spark.sql.shuffle.partitions: 4", "spark.sql.shuffle.partitions: 010")
    assert env != LOCAL
    config = load_pipeline("orders", "local", home=write_home(tmp_path, pipeline, env), environ={})
    assert (config.pipeline.source.slot, config.pipeline.source.publication) == ("0755", "1_000")
    assert config.env.spark.conf["spark.sql.shuffle.partitions"] == "010"


def test_a_file_that_is_not_utf8_nested_too_deep_or_a_number_too_big_is_named(
    tmp_path: Path,
) -> None:
    home = write_home(tmp_path)
    (home / "pipelines" / "orders.yaml").write_bytes(b"name: orders\nsource:\n  dsn: \xff\xfe\n")
    with pytest.raises(ConfigError) as e:
        load_pipeline("orders", "local", home=home, environ={})
    assert str(e.value) == (
        "pipelines/orders.yaml: not UTF-8 text: byte 0xff at offset 28 (save the file as UTF-8)"
    )
    assert load_error(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n").endswith(
        "malformed YAML: nested too deep"
    )
    big = "9" * 400
    message = load_error(tmp_path, CONTRACT + f"capture:\n  trigger_interval_s: {big}\n")
    assert message.endswith("capture.trigger_interval_s: expected a finite number, got one of "
                            "400 digits")  # fmt: skip


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("not a dsn at all", 'missing "=" after "not" in connection info string'),
        ("host=h password=se cret", "libpq cannot parse it (write key=value pairs"),
        ("postgresql://u@127.0.0.1:notaport/db", "port 'notaport' is not a TCP port"),
        ("host=h port=99999999 dbname=x", "port '99999999' is not a TCP port (1 to 65535)"),
        ("postgresql://u@h/db?sslmode=bogus", "sslmode 'bogus' is not one of disable, allow"),
        ("host=h target_session_attrs=bogus", "target_session_attrs 'bogus' is not one of any"),
    ],
)
def test_a_connection_string_libpq_refuses_is_a_configuration_error(
    dsn: str, problem: str, tmp_path: Path
) -> None:
    """Found at load (exit 2, naming the key), not by a run whose connections all fail and
    which exits 75 ("retry") for a value no retry fixes; never quoting a password."""
    message = load_error(tmp_path, CONTRACT, {"ORDERS_PG_DSN": dsn})
    assert "source.dsn: " in message
    assert problem in message, message
    assert "cret" not in message


def test_numbers_past_what_postgresql_and_jdbc_take_are_refused(tmp_path: Path) -> None:
    for key in ("fetch.size", "lock.timeout.ms"):
        message = load_error(
            tmp_path, CONTRACT.replace("snapshot:\n", f"snapshot:\n  {key}: 99999999999\n")
        )
        assert message.endswith(f"snapshot.{key}: 99999999999 must be at most 2147483647")


@pytest.mark.parametrize("text", ["DB_PASSWORD=hunter2\n", "- hunter2\n"])
def test_a_file_that_is_not_a_mapping_is_named_without_its_content(
    text: str, tmp_path: Path
) -> None:
    """A secrets file given by mistake (`--env ./prod.env`) is not echoed into the logs."""
    message = load_error(tmp_path, text)
    assert message.startswith("pipelines/orders.yaml: the top level must be a mapping of keys")
    assert message.endswith("(is it the right file?)")
    assert "hunter2" not in message


def test_a_lake_root_that_is_a_file_or_holds_a_nul_is_refused_at_load(tmp_path: Path) -> None:
    """Before, `cdc status` met them as an unexpected NotADirectoryError or ValueError."""
    afile = tmp_path / "hostname"
    afile.write_text("x")
    message = load_error(tmp_path, CONTRACT.replace("${LAKE_ROOT:-./lake}/orders", str(afile)))
    assert message.endswith(f"target.root: {afile} is a file, not a directory: the lake is a "
                            "directory (created if missing)")  # fmt: skip
    message = load_error(tmp_path, CONTRACT.replace("${LAKE_ROOT:-./lake}/orders", '"/tmp/a\\0b"'))
    assert message.endswith("target.root: '/tmp/a\\x00b': a path cannot hold a NUL character")


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (CONTRACT.replace("publication: orders_cdc", "publication: " + "p" * 64),
         f"pipelines/orders.yaml: source.publication: '{'p' * 64}' is longer than PostgreSQL's "
         "63 bytes (the server would cut it, and two pipelines could share the cut name)"),
        (CONTRACT + "capture:\n  trigger_interval_s: 1e10\n",
         "pipelines/orders.yaml: capture.trigger_interval_s: 10000000000.0 is more than "
         "31,536,000 s (a year)"),
        (CONTRACT + "capture:\n  chunk_changes: 1.5\n",
         "pipelines/orders.yaml: capture.chunk_changes: expected a whole number, got float 1.5"),
        (CONTRACT + "silver:\n  soft_delete: 1\n",
         "pipelines/orders.yaml: silver.soft_delete: expected true or false, got int 1"),
    ],
    ids=["publication-too-long", "wait-past-a-year", "float-for-int", "int-for-bool"],
)  # fmt: skip
def test_values_past_what_the_server_or_python_take_are_refused_in_plain_words(
    tmp_path: Path, pipeline: str, message: str
) -> None:
    """A publication name the server would cut to 63 bytes; a trigger interval a `--continuous`
    run's wait cannot take (it failed after the first batch); and the type of a wrong value as
    YAML wrote it, not the loader's own class (`_WrittenFloat`)."""
    assert load_error(tmp_path, pipeline) == message
