"""`cdc import-debezium`: a Debezium connector configuration becomes a pipeline file that loads;
the password never lands in it, and nothing is dropped without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cdc_core.cli import main
from cdc_core.config import load_pipeline
from cdc_core.config.debezium import UNSUPPORTED, mapped_properties
from cdc_core.config.debezium_file import parse_properties

# The "Connector configuration example" of the Debezium PostgreSQL documentation
# (reference 002), without its (1)..(9) callouts.
DOCS_EXAMPLE = """\
{
  "name": "fulfillment-connector",
  "config": {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "database.hostname": "192.168.99.100",
    "database.port": "5432",
    "database.user": "postgres",
    "database.password": "postgres",
    "database.dbname" : "postgres",
    "topic.prefix": "fulfillment",
    "table.include.list": "public.inventory"
  }
}
"""
PASSWORD = "Sup3r-s3cret!pw"
BASE = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "plugin.name": "pgoutput",
    "database.hostname": "db.example.com",
    "database.port": "5433",
    "database.user": "cdc_user",
    "database.password": PASSWORD,
    "database.dbname": "shop",
    "topic.prefix": "shop",
    "slot.name": "shop_cdc",
    "publication.name": "shop_pub",
    "table.include.list": "public.orders,public.customers",
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.yaml").write_text("spark:\n  master: local[1]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDC_HOME", str(tmp_path))
    return tmp_path


def run(
    capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:  # (exit code, stdout, stderr)
    code = main(["import-debezium", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_json(home: Path, config: dict[str, str], wrapped: bool = True) -> str:
    data = {"name": "shop-connector", "config": config} if wrapped else config
    (home / "connector.json").write_text(json.dumps(data, indent=2))
    return "connector.json"


def pipeline_data(home: Path, name: str = "shop") -> dict[str, object]:
    data = yaml.safe_load((home / "pipelines" / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_the_debezium_docs_example_imports_and_the_file_loads(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "fulfillment.json").write_text(DOCS_EXAMPLE)
    code, out, _ = run(capsys, "fulfillment.json")
    assert code == 0
    assert "set FULFILLMENT_PG_PASSWORD" in out
    config = load_pipeline(
        "fulfillment", home=home, environ={"FULFILLMENT_PG_PASSWORD": "from-env"}
    ).pipeline
    assert config.name == "fulfillment"
    assert config.source.dsn.conninfo == (
        "postgresql://postgres:from-env@192.168.99.100:5432/postgres"
    )
    assert [str(t) for t in config.source.tables] == ["public.inventory"]
    assert (config.source.slot, config.source.publication) == ("debezium", "dbz_publication")
    assert config.target.root == str(home / "lake" / "fulfillment")


def test_the_bare_config_object_imports_as_the_posted_json_does(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, write_json(home, BASE, wrapped=True))[0] == 0
    wrapped = pipeline_data(home)
    assert run(capsys, write_json(home, BASE, wrapped=False), "--force")[0] == 0
    assert pipeline_data(home) == wrapped
    assert wrapped["source"] == {
        "dsn": "postgresql://cdc_user:${SHOP_PG_PASSWORD}@db.example.com:5433/shop",
        "slot": "shop_cdc",
        "publication": "shop_pub",
        "tables": ["public.orders", "public.customers"],
    }


def test_a_properties_file_imports_with_java_escapes_and_continued_lines(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [f"{k}={v}" for k, v in BASE.items() if k != "table.include.list"]
    (home / "shop.properties").write_text(
        "# standalone worker\n! also a comment\n" + "\n".join(lines) + "\n"
        "table.include.list = public\\\\.orders,\\\n    public.customers\n"
        "column.mask.with.8.chars: public\\\\.customers\\\\.email\n"
    )
    code, _, err = run(capsys, "shop.properties")
    assert code == 0, err
    source = pipeline_data(home)["source"]
    assert isinstance(source, dict)
    assert source["tables"] == ["public.orders", "public.customers"]
    assert source["column.transforms"] == {"column.mask.with.8.chars": "public\\.customers\\.email"}
    assert load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"})


def test_properties_are_read_as_java_reads_them() -> None:
    text = "a=1\nb : two words\nc three\nd=x\\\n  y\ne=\\u00e9\\t\\:\nf\n"
    assert parse_properties(text) == {
        "a": "1", "b": "two words", "c": "three", "d": "xy", "e": "é\t:", "f": "",
    }  # fmt: skip


def test_a_malformed_unicode_escape_is_named_as_java_refuses_it(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "c.properties").write_text("".join(f"{k}={v}\n" for k, v in BASE.items())
                                       + "foo=\\uZZZZ\n")  # fmt: skip
    code, _, err = run(capsys, "c.properties")
    assert code == 2
    assert err == (
        "error: c.properties: malformed escape '\\\\uZZZZ': four hex digits follow \\u, as "
        "Java reads .properties\n"
    )


def test_a_topic_prefix_that_makes_no_name_is_named_as_such(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"topic.prefix": "!!!"}, wrapped=False))
    assert code == 2
    assert err == (
        "error: connector.json: topic.prefix: '!!!' makes no pipeline name (letters, digits, "
        "'_' and '-'); give --name\n"
    )


@pytest.mark.parametrize("form", ["json", "properties"])
def test_the_password_never_lands_in_the_file(
    home: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    config = BASE | {"database.sslpassword": "key-" + PASSWORD}
    if form == "json":
        file = write_json(home, config)
    else:
        (home / "c.properties").write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        file = "c.properties"
    code, out, err = run(capsys, file)
    assert code == 0, err
    text = (home / "pipelines" / "shop.yaml").read_text()
    assert PASSWORD not in text + out + err
    assert "${SHOP_PG_PASSWORD}@" in text
    assert "sslpassword=${SHOP_PG_SSLPASSWORD}" in text
    assert "set SHOP_PG_PASSWORD" in out


@pytest.mark.parametrize("plugin", ["decoderbufs", "wal2json"])
def test_a_plugin_other_than_pgoutput_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str], plugin: str
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"plugin.name": plugin}))
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"error: connector.json: plugin.name: '{plugin}': ")
    assert "pgoutput only" in err
    assert not (home / "pipelines").exists()


def test_kafka_properties_are_listed_as_ignored_and_left_out(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka = {
        "tasks.max": "1",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "topic.creation.default.partitions": "1",
        "producer.override.compression.type": "lz4",
        "schema.history.internal.kafka.topic": "history",
        "tombstones.on.delete": "false",
    }
    code, out, _ = run(capsys, write_json(home, BASE | kafka))
    assert code == 0
    ignored = out.split("ignored (Kafka, Kafka Connect, JVM):\n")[1].split("\nnote:")[0]
    for prop in [*kafka, "connector.class", "name"]:
        assert prop in ignored, prop
    assert "mapped 10, ignored (Kafka) 10, unsupported 0, unknown 0" in out
    text = (home / "pipelines" / "shop.yaml").read_text()
    header, body = text.split("\nname: shop\n")
    assert "ignored (Kafka): " in header
    assert "converter" not in body
    assert "transforms" not in body


def test_a_typo_is_reported_with_the_property_it_resembles(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, write_json(home, BASE | {"heartbeat.intervl.ms": "1000"}))
    assert code == 0
    assert "  heartbeat.intervl.ms (did you mean 'heartbeat.interval.ms'?)" in out
    assert out.endswith("unsupported 0, unknown 1\n")
    assert "#   unknown: heartbeat.intervl.ms" in (home / "pipelines" / "shop.yaml").read_text()


def test_every_property_without_a_counterpart_says_what_happens_instead() -> None:
    silent = [prop for prop, reason in UNSUPPORTED.items() if not reason.strip()]
    assert silent == []


def test_a_debezium_property_without_a_counterpart_is_reported_as_not_supported(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, write_json(home, BASE | {"slot.drop.on.stop": "true"}))
    assert code == 0
    supported = out.split("not supported:\n")[1]
    assert supported.startswith(
        "  slot.drop.on.stop: runs keep their slot between them; cdc retire"
    )
    assert "unsupported 1, unknown 0" in out


def test_an_existing_file_is_replaced_only_with_force(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "pipelines").mkdir()
    (home / "pipelines" / "shop.yaml").write_text("# mine\n")
    file = write_json(home, BASE)
    code, _, err = run(capsys, file)
    assert code == 2
    assert err == "error: cdc import-debezium: pipelines/shop.yaml exists; --force replaces it\n"
    assert (home / "pipelines" / "shop.yaml").read_text() == "# mine\n"
    assert run(capsys, file, "--force")[0] == 0
    assert pipeline_data(home)["name"] == "shop"


def test_a_value_the_loader_refuses_names_the_debezium_property_and_writes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"decimal.handling.mode": "exact"}))
    assert code == 2
    assert err.startswith("error: connector.json: decimal.handling.mode: 'exact' is not one of")
    assert "(as silver.decimal.handling.mode of the pipeline file)" in err
    assert not (home / "pipelines").exists()


def test_snapshot_modes_map_and_deprecated_ones_are_renamed(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, write_json(home, BASE | {"snapshot.mode": "never"}))
    assert code == 0
    assert pipeline_data(home)["snapshot"] == {"mode": "no_data"}
    assert "snapshot.mode 'never' is deprecated or renamed in Debezium" in out
    code, _, err = run(capsys, write_json(home, BASE | {"snapshot.mode": "custom"}), "--force")
    assert code == 2
    assert err.startswith("error: connector.json: snapshot.mode: 'custom' has no counterpart")
    code, out, _ = run(capsys, write_json(home, BASE | {"snapshot.mode": "NEVER"}), "--force")
    assert code == 0  # Debezium parses a mode in any case
    assert pipeline_data(home)["snapshot"] == {"mode": "no_data"}
    code, _, _ = run(capsys, write_json(home, BASE | {"snapshot.mode": "When_Needed"}), "--force")
    assert code == 0
    assert pipeline_data(home)["snapshot"] == {"mode": "when_needed"}


BASED = "snapshot.mode.configuration.based."


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ({"snapshot.data": "true", "start.stream": "true"}, "always"),
        ({"snapshot.data": "true", "start.stream": "TRUE", "snapshot.on.data.error": "true"},
         "always"),
        ({"start.stream": "true"}, "no_data"),
        ({"start.stream": "true", "snapshot.on.data.error": "false"}, "no_data"),
    ],
)  # fmt: skip
def test_configuration_based_is_written_as_the_mode_its_flags_describe(
    home: Path, capsys: pytest.CaptureFixture[str], flags: dict[str, str], mode: str
) -> None:
    """Debezium's configuration_based snapshots at every start when snapshot.data is set,
    whatever is stored, and streams when start.stream is: always and no_data do the same."""
    props = (
        BASE | {"snapshot.mode": "configuration_based"} | {BASED + k: v for k, v in flags.items()}
    )

    code, out, _ = run(capsys, write_json(home, props))

    assert code == 0, out
    assert pipeline_data(home)["snapshot"] == {"mode": mode}
    assert f"behaves as {mode}: written as {mode}" in out
    assert "unsupported 0, unknown 0" in out
    loaded = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"})
    assert loaded.pipeline.snapshot.mode == mode


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"start.stream": "true", "snapshot.on.data.error": "true"},
         "a stream without a first snapshot that re-snapshots when its position is lost"),
        ({"snapshot.data": "true"}, "a snapshot at every start without a stream"),
        ({}, "neither a snapshot nor a stream"),
    ],
)  # fmt: skip
def test_configuration_based_flags_no_mode_matches_are_refused_naming_the_closest(
    home: Path, capsys: pytest.CaptureFixture[str], flags: dict[str, str], why: str
) -> None:
    props = (
        BASE | {"snapshot.mode": "configuration_based"} | {BASED + k: v for k, v in flags.items()}
    )

    code, _, err = run(capsys, write_json(home, props))

    assert code == 2
    assert err.startswith("error: connector.json: snapshot.mode: configuration_based with ")
    assert why in err
    assert not (home / "pipelines").exists()
    bad = BASE | {"snapshot.mode": "configuration_based", BASED + "start.stream": "yes"}
    code, _, err = run(capsys, write_json(home, bad))
    assert code == 2
    assert err.startswith(f"error: connector.json: {BASED}start.stream: 'yes' is not true or false")


def test_time_precision_mode_nanoseconds_is_imported_and_loads(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"time.precision.mode": "nanoseconds"}))
    assert code == 0, err
    assert pipeline_data(home)["silver"] == {"time.precision.mode": "nanoseconds"}
    silver = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"}).pipeline.silver
    assert silver.time_precision_mode == "nanoseconds"


def test_errors_max_retries_minus_one_carries_over_as_no_limit(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"errors.max.retries": "-1"}))
    assert code == 0, err
    assert pipeline_data(home)["capture"] == {"retries": -1}
    capture = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"}).pipeline.capture
    assert capture.gives_up(1_000) is False


def test_one_to_one_properties_come_from_the_config_fields_metadata() -> None:
    targets = {prop: t.path for prop, t in mapped_properties().items()}
    assert targets["slot.name"] == "source.slot"
    assert targets["publication.name"] == "source.publication"
    assert targets["incremental.snapshot.chunk.size"] == "snapshot.chunk.size"
    assert targets["snapshot.lock.timeout.ms"] == "snapshot.lock.timeout.ms"
    assert targets["snapshot.tables.order.by.row.count"] == "snapshot.tables.order.by.row.count"
    assert targets["guardrail.collections.max"] == "source.guardrail.collections.max"
    assert targets["database.initial.statements"] == "source.database.initial.statements"
    assert targets["slot.failover"] == "source.slot.failover"
    assert targets["guardrail.collections.limit.action"] == (
        "source.guardrail.collections.limit.action"
    )
    assert targets["skip.messages.without.change"] == "source.skip.messages.without.change"
    assert targets["decimal.handling.mode"] == "silver.decimal.handling.mode"
    assert targets["message.key.columns"] == "source.message.key.columns"
    assert "database.password" not in targets  # converted: never written


def test_debezium_options_carry_over_with_dollars_kept_literal(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {
        "message.key.columns": "public.orders:id",
        "heartbeat.interval.ms": "60000",
        "heartbeat.action.query": "INSERT INTO hb VALUES ('${not_a_var}', '$$')",
        "provide.transaction.metadata": "true",
        "time.precision.mode": "connect",
        "table.whitelist": "public.orders",  # Debezium 1.x's table.include.list
        "database.initial.statements": "SET app.tag = '${x};;$$'; SET work_mem = '8MB'",
    }
    config = BASE | options
    del config["table.include.list"]
    code, out, err = run(capsys, write_json(home, config))
    assert code == 0, err
    assert "table.whitelist is Debezium 1.x's name of table.include.list" in out
    source = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"}).pipeline.source
    assert source.heartbeat_action_query == options["heartbeat.action.query"]
    assert source.heartbeat_interval_ms == 60000
    assert source.provide_transaction_metadata is True
    assert str(source.message_key_columns) == "public.orders:id"
    assert [str(t) for t in source.tables] == ["public.orders"]
    assert source.dsn.initial_statements == ("SET app.tag = '${x};$$'", "SET work_mem = '8MB'")


def test_a_regex_include_list_is_kept_and_the_tables_left_out(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, write_json(home, BASE | {"table.include.list": "public\\.ord.*"}))
    assert code == 0
    source = pipeline_data(home)["source"]
    assert isinstance(source, dict)
    assert source["table.include.list"] == "public\\.ord.*"
    assert "tables" not in source  # each run finds the tables the list matches
    assert "each run captures the tables it matches" in out
    loaded = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"})
    assert loaded.pipeline.source.awaits_discovery


def test_a_schema_include_list_alone_chooses_the_tables(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {k: v for k, v in BASE.items() if k != "table.include.list"}
    code, out, err = run(capsys, write_json(home, config | {"schema.include.list": "sales"}))
    assert code == 0, err
    source = pipeline_data(home)["source"]
    assert isinstance(source, dict)
    assert source["schema.include.list"] == "sales"
    assert "tables" not in source
    assert "the tables of the schemas schema.include.list matches" in out


def test_a_connector_that_captures_every_table_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {k: v for k, v in BASE.items() if k != "table.include.list"}
    code, _, err = run(capsys, write_json(home, config))
    assert code == 2
    assert "table.include.list: not set, and neither is schema.include.list" in err
    assert not (home / "pipelines" / "shop.yaml").exists()


def test_the_name_comes_from_topic_prefix_made_valid(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, write_json(home, BASE | {"topic.prefix": "shop.prod"}))
    assert code == 0
    assert pipeline_data(home, "shop_prod")["name"] == "shop_prod"
    assert "the pipeline is named shop_prod" in out
    code, _, _ = run(capsys, write_json(home, BASE), "--name", "orders")
    assert code == 0
    assert pipeline_data(home, "orders")["target"] == {"root": "${LAKE_ROOT:-./lake}/orders"}


def test_kafka_and_jmx_channels_are_dropped_from_the_channel_lists(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    channels = {"signal.enabled.channels": "source,kafka", "notification.enabled.channels": "jmx"}
    code, out, err = run(capsys, write_json(home, BASE | channels))
    assert code == 0, err
    assert "signal.enabled.channels: kafka dropped (Kafka's, or a JVM's); left: source" in out
    assert "notification.enabled.channels: jmx dropped (Kafka's, or a JVM's); left: none" in out
    assert pipeline_data(home)["snapshot"] == {"signal.enabled.channels": "source"}
    assert "notification.enabled.channels" not in str(pipeline_data(home)["source"])


def test_the_query_timeout_in_milliseconds_becomes_seconds(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, write_json(home, BASE | {"database.query.timeout.ms": "2500"}))
    assert code == 0, err
    assert pipeline_data(home)["source"]["query_timeout_s"] == 2.5  # type: ignore[index]
    assert "database.query.timeout.ms -> source.query_timeout_s" in out
    assert "not supported:" not in out
    source = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"}).pipeline.source
    assert source.dsn.query_timeout_s == 2.5
    run(capsys, write_json(home, BASE | {"database.query.timeout.ms": "0"}), "--force")
    assert pipeline_data(home)["source"]["query_timeout_s"] == 0  # type: ignore[index]


def test_a_negative_query_timeout_is_refused_naming_the_property(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, write_json(home, BASE | {"database.query.timeout.ms": "-1"}))
    assert code == 2
    assert err.startswith("error: connector.json: database.query.timeout.ms: -1 is negative")
    assert not (home / "pipelines").exists()


def test_the_failure_handling_mode_carries_over_to_silver(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    props = BASE | {"event.processing.failure.handling.mode": "warn"}
    code, out, _ = run(capsys, write_json(home, props))
    assert code == 0
    silver = pipeline_data(home)["silver"]
    assert silver == {"event.processing.failure.handling.mode": "warn"}
    assert "unsupported 0, unknown 0" in out
    config = load_pipeline("shop", home=home, environ={"SHOP_PG_PASSWORD": "x"})
    assert config.pipeline.silver.event_processing_failure_handling_mode == "warn"
