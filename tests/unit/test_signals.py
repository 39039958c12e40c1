"""Signal rows parse into snapshot requests with Debezium's semantics and its exact literals."""

from __future__ import annotations

import logging

import pytest

from cdc_core.identifiers import TableName
from cdc_core.signals import (
    PauseRequest,
    SignalProblem,
    SignalRow,
    SnapshotRequest,
    StopRequest,
    parse_signal,
    processed_keys,
    sort_out,
)

TABLE1 = TableName("schema1", "table1")
TABLE2 = TableName("schema1", "table2")
PRODUCTS = TableName("schema1", "products")
CAPTURED = [TABLE1, TABLE2, PRODUCTS]

# The `data` of the reference's INSERT, as PostgreSQL stores it once `\'` is unescaped.
REFERENCE_EXECUTE = (
    '{"data-collections": ["schema1.table1", "schema1.table2"], "type":"incremental", '
    '"additional-conditions":[{"data-collection": "schema1.table1" ,"filter":"color=\'blue\'"}]}'
)
REFERENCE_STOP = '{"data-collections": ["schema1.table1", "schema1.table2"], "type":"incremental"}'
REFERENCE_BLOCKING = (
    '{"type": "blocking", "data-collections": ["schema1.table1", "schema1.table2"], '
    '"additional-conditions": [{"data-collection": "schema1.table1", "filter": '
    '"SELECT * FROM [schema1].[table1] WHERE column1 = 0 ORDER BY column2 DESC"}, '
    '{"data-collection": "schema1.table2", "filter": '
    '"SELECT * FROM [schema1].[table2] WHERE column2 > 0"}]}'
)


def execute(data: str | None, captured: list[TableName] = CAPTURED) -> object:
    return parse_signal("ad-hoc-1", "execute-snapshot", data, captured)


def test_reference_execute_snapshot_is_incremental_with_a_where_filter() -> None:
    assert execute(REFERENCE_EXECUTE) == SnapshotRequest(
        signal_id="ad-hoc-1",
        kind="incremental",
        tables=(TABLE1, TABLE2),
        conditions={TABLE1: "color='blue'"},
        surrogate_key=None,
    )


PRODUCTS_FILTERS = [
    (
        '{"data-collections": ["schema1.products"],"type":"incremental", "additional-conditions":'
        '[{"data-collection": "schema1.products", "filter": "color=blue"}]}',
        "color=blue",
    ),
    (
        '{"data-collections": ["schema1.products"],"type":"incremental", "additional-conditions":'
        '[{"data-collection": "schema1.products", "filter": "color=blue AND quantity>10"}]}',
        "color=blue AND quantity>10",
    ),
    (
        '{"data-collections": ["schema1.products"], "type": "INCREMENTAL", "additional-conditions":'
        ' [{"data-collection": "schema1.products" ,"filter":"color=\'blue\'"}]}',
        "color='blue'",
    ),
    (
        '{"data-collections": ["schema1.products"], "type": "INCREMENTAL", "additional-conditions":'
        ' [{"data-collection": "schema1.products" ,"filter":"color=\'blue\' AND brand=\'MyBrand\'"}]}',
        "color='blue' AND brand='MyBrand'",
    ),
]


@pytest.mark.parametrize(("data", "condition"), PRODUCTS_FILTERS)
def test_reference_filters_are_kept_verbatim(data: str, condition: str) -> None:
    assert execute(data) == SnapshotRequest(
        signal_id="ad-hoc-1",
        kind="incremental",
        tables=(PRODUCTS,),
        conditions={PRODUCTS: condition},
        surrogate_key=None,
    )


def test_upper_case_incremental_is_accepted() -> None:
    request = execute('{"data-collections": ["schema1.table1"], "type": "INCREMENTAL"}')
    assert isinstance(request, SnapshotRequest)
    assert request.kind == "incremental"


def test_snapshot_type_omitted_runs_incremental() -> None:
    request = execute('{"data-collections": ["schema1.table1"]}')
    assert isinstance(request, SnapshotRequest)
    assert request.kind == "incremental"
    assert request.conditions == {}


def test_blocking_snapshot_keeps_full_select_filters() -> None:
    assert execute(REFERENCE_BLOCKING) == SnapshotRequest(
        signal_id="ad-hoc-1",
        kind="blocking",
        tables=(TABLE1, TABLE2),
        conditions={
            TABLE1: "SELECT * FROM [schema1].[table1] WHERE column1 = 0 ORDER BY column2 DESC",
            TABLE2: "SELECT * FROM [schema1].[table2] WHERE column2 > 0",
        },
        surrogate_key=None,
    )


def test_blocking_filter_that_is_only_a_condition_is_a_problem() -> None:
    problem = execute(
        '{"type": "blocking", "data-collections": ["schema1.products"], "additional-conditions": '
        '[{"data-collection": "schema1.products", "filter": "color=blue"}]}'
    )
    assert isinstance(problem, SignalProblem)
    assert "full SELECT statement" in problem.reason


def test_unknown_snapshot_type_is_a_problem() -> None:
    problem = execute('{"data-collections": ["schema1.table1"], "type": "initial"}')
    assert isinstance(problem, SignalProblem)
    assert '"incremental" (the default) or "blocking"' in problem.reason


def test_quoted_name_with_a_dot_matches_exactly_that_table() -> None:
    my_table, look_alike = TableName("public", "My.Table"), TableName("public", "MyXTable")
    request = execute('{"data-collections": ["public.\\"My.Table\\""]}', [look_alike, my_table])
    assert isinstance(request, SnapshotRequest)
    assert request.tables == (my_table,)


def test_entries_are_regular_expressions_over_schema_and_table() -> None:
    first, second = TableName("public", "MyFirstTable"), TableName("public", "MySecondTable")
    other = TableName("sales", "orders")
    captured = [first, other, second]
    request = execute(
        '{"data-collections": ["public.MyFirstTable", "public.MySecondTable"]}', captured
    )
    assert isinstance(request, SnapshotRequest)
    assert request.tables == (first, second)
    everything_public = execute('{"data-collections": ["public.*"]}', captured)
    assert isinstance(everything_public, SnapshotRequest)
    assert everything_public.tables == (first, second)


def test_a_regular_expression_must_match_the_whole_name() -> None:
    problem = execute('{"data-collections": ["schema1.table"]}')
    assert isinstance(problem, SignalProblem)
    assert "matches no captured table" in problem.reason


def test_names_match_case_sensitively_as_in_the_catalog() -> None:
    problem = execute('{"data-collections": ["schema1.TABLE1"]}')
    assert isinstance(problem, SignalProblem)


def test_tables_come_in_captured_order_once_each() -> None:
    request = execute('{"data-collections": ["schema1.products", "schema1.table.*", "schema1.*"]}')
    assert isinstance(request, SnapshotRequest)
    assert request.tables == (TABLE1, TABLE2, PRODUCTS)


def test_empty_data_collections_is_a_no_op() -> None:
    assert execute('{"data-collections": [], "type": "incremental"}') is None


def test_missing_data_collections_is_a_problem() -> None:
    problem = execute('{"type": "incremental"}')
    assert isinstance(problem, SignalProblem)
    assert "data-collections is required" in problem.reason


def test_unmatched_entries_are_logged_and_the_rest_go_ahead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="cdc_core.signals"):
        request = execute('{"data-collections": ["schema1.table1", "schema1.gone"]}')
    assert isinstance(request, SnapshotRequest)
    assert request.tables == (TABLE1,)
    assert "schema1.gone" in caplog.text
    assert "ad-hoc-1" in caplog.text


def test_nothing_matched_is_a_problem_listing_the_captured_tables() -> None:
    problem = execute('{"data-collections": ["schema2.table1"]}')
    assert problem == SignalProblem(
        "ad-hoc-1",
        "execute-snapshot signal 'ad-hoc-1': data-collections ['schema2.table1'] matches no "
        "captured table; captured: schema1.table1, schema1.table2, schema1.products",
    )


def test_condition_for_a_table_outside_the_request_is_a_problem() -> None:
    problem = execute(
        '{"data-collections": ["schema1.table1"], "additional-conditions": '
        '[{"data-collection": "schema1.products", "filter": "color=blue"}]}'
    )
    assert isinstance(problem, SignalProblem)
    assert "'schema1.products', which is not among the tables of this snapshot" in problem.reason


def test_two_conditions_for_one_table_is_a_problem() -> None:
    problem = execute(
        '{"data-collections": ["schema1.table1"], "additional-conditions": ['
        '{"data-collection": "schema1.table1", "filter": "a=1"}, '
        '{"data-collection": "schema1.table.*", "filter": "b=2"}]}'
    )
    assert isinstance(problem, SignalProblem)
    assert "a second condition for schema1.table1" in problem.reason


def test_surrogate_key_is_carried() -> None:
    request = execute('{"data-collections": ["schema1.table1"], "surrogate-key": "customer_id"}')
    assert isinstance(request, SnapshotRequest)
    assert request.surrogate_key == "customer_id"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "data is empty"),
        ("  ", "data is empty"),
        ('{"data-collections": ["schema1.table1"]', "not valid JSON"),
        ('["schema1.table1"]', "must be a JSON object, not list"),
        ('{"data-collections": "schema1.table1"}', "data-collections must be a list"),
        ('{"data-collections": [1]}', "data-collections[0] must be a non-empty string"),
        ('{"data-collections": ["schema1.(table"]}', "not a valid regular expression"),
        ('{"data-collections": ["schema1.table1"], "type": 1}', "type must be"),
        (
            '{"data-collections": ["schema1.table1"], "additional-conditions": {}}',
            "additional-conditions must be a list",
        ),
        (
            '{"data-collections": ["schema1.table1"], "additional-conditions": ["color=blue"]}',
            "additional-conditions[0] must be",
        ),
        (
            '{"data-collections": ["schema1.table1"], '
            '"additional-conditions": [{"data-collection": "schema1.table1"}]}',
            "additional-conditions[0].filter must be a non-empty string",
        ),
        (
            '{"data-collections": ["schema1.table1"], "surrogate-key": ["id"]}',
            "surrogate-key must be a column name",
        ),
    ],
)
def test_malformed_execute_snapshot_is_a_problem_naming_it(data: str | None, reason: str) -> None:
    problem = execute(data)
    assert isinstance(problem, SignalProblem)
    assert problem.signal_id == "ad-hoc-1"
    assert reason in problem.reason


@pytest.mark.parametrize(
    "data",
    [
        REFERENCE_STOP,
        '{"data-collections": ["schema1.table1", "schema1.table2"], "type": "INCREMENTAL"}',
    ],
)
def test_reference_stop_snapshot_stops_the_listed_tables(data: str) -> None:
    assert parse_signal("ad-hoc-1", "stop-snapshot", data, CAPTURED) == StopRequest(
        "ad-hoc-1", (TABLE1, TABLE2)
    )


@pytest.mark.parametrize(
    "data", ['{"type": "incremental"}', '{"data-collections": [], "type": "incremental"}']
)
def test_stop_snapshot_without_data_collections_stops_everything(data: str) -> None:
    assert parse_signal("ad-hoc-1", "stop-snapshot", data, CAPTURED) == StopRequest(
        "ad-hoc-1", None
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ('{"data-collections": ["schema1.table1"]}', "data.type is required"),
        (None, "data is empty"),
        ('{"data-collections": ["schema1.table1"], "type": "blocking"}', 'must be "incremental"'),
    ],
)
def test_stop_snapshot_without_incremental_type_fails(data: str | None, reason: str) -> None:
    problem = parse_signal("ad-hoc-1", "stop-snapshot", data, CAPTURED)
    assert isinstance(problem, SignalProblem)
    assert problem.reason.startswith("stop-snapshot signal 'ad-hoc-1': ")
    assert reason in problem.reason


def test_stop_snapshot_matching_no_captured_table_is_a_problem() -> None:
    problem = parse_signal(
        "ad-hoc-1",
        "stop-snapshot",
        '{"data-collections": ["x.y"], "type": "incremental"}',
        CAPTURED,
    )
    assert isinstance(problem, SignalProblem)
    assert "matches no captured table" in problem.reason


@pytest.mark.parametrize(
    ("type_", "data"),
    [
        ("snapshot-window-open", '{"openWindowTimestamp": "2024-01-01T00:00:00Z"}'),
        ("snapshot-window-close", None),
        ("log", '{"message": "hello"}'),
        ("something-else", None),
    ],
)
def test_other_signal_types_are_ignored(type_: str, data: str | None) -> None:
    assert parse_signal("id-1", type_, data, CAPTURED) is None


@pytest.mark.parametrize("data", [None, "", '{"type": "incremental"}', "not json", "[1]"])
def test_pause_snapshot_pauses_whatever_its_data(data: str | None) -> None:
    """Debezium reads no data for pause-snapshot and resume-snapshot."""
    assert parse_signal("p-1", "pause-snapshot", data, CAPTURED) == PauseRequest("p-1")


@pytest.mark.parametrize("data", [None, '{"type": "incremental"}'])
def test_resume_snapshot_resumes_whatever_its_data(data: str | None) -> None:
    assert parse_signal("r-1", " resume-snapshot ", data, CAPTURED) == PauseRequest(
        "r-1", resume=True
    )


def test_schema_changes_is_reported_as_unsupported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cdc_core.signals"):
        assert parse_signal("s-1", "schema-changes", "{}", CAPTURED) is None
    assert "'schema-changes' signals are not supported" in caplog.text


def test_log_signal_logs_its_message(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cdc_core.signals"):
        parse_signal("l-1", "log", '{"message": "Signal message at offset {}"}', CAPTURED)
    assert "Signal message at offset {}" in caplog.text


def test_watermark_rows_are_ignored_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cdc_core.signals"):
        parse_signal("5f1c-open", "snapshot-window-open", None, CAPTURED)
    assert caplog.text == ""


def test_requests_are_hashable_values() -> None:
    request = execute(REFERENCE_EXECUTE)
    assert isinstance(request, SnapshotRequest)
    assert {request, request} == {request}


def row(signal_id: str, xmin: str, processed: bool = False) -> SignalRow:
    return SignalRow(signal_id, "log", None, xmin, processed)


def test_a_row_is_known_by_its_inserting_transaction_and_its_id() -> None:
    assert row("ad-hoc-1", "742").key == "742:ad-hoc-1"
    assert row("ad-hoc-1", "742").key != row("ad-hoc-1", "918").key


def test_rows_not_processed_are_carried_out_in_the_order_read() -> None:
    rows = [row("sig-9", "10"), row("sig-10", "11", processed=True), row("a-1", "12")]
    pending, kept = sort_out(rows, {"processed": ["11:sig-10"]})
    assert [r.id for r in pending] == ["sig-9", "a-1"]
    assert kept == ["11:sig-10"]


def test_processed_keys_of_rows_gone_from_the_table_are_dropped() -> None:
    stored = {"processed": ["5:ad-hoc-1", "6:ad-hoc-2", "7:ad-hoc-3"]}
    assert processed_keys(stored) == ["5:ad-hoc-1", "6:ad-hoc-2", "7:ad-hoc-3"]
    pending, kept = sort_out([row("ad-hoc-2", "6", processed=True)], stored)
    assert (pending, kept) == ([], ["6:ad-hoc-2"])


def test_a_row_inserted_again_with_a_processed_id_is_carried_out() -> None:
    pending, kept = sort_out([row("ad-hoc-1", "900")], {"processed": ["5:ad-hoc-1"]})
    assert [r.key for r in pending] == ["900:ad-hoc-1"]
    assert kept == []


def test_a_row_whose_job_was_saved_is_not_carried_out_again() -> None:
    pending, kept = sort_out([row("ad-hoc-1", "5")], {"processed": []}, carried_out={"5:ad-hoc-1"})
    assert (pending, kept) == ([], ["5:ad-hoc-1"])


def test_ids_recorded_by_earlier_versions_become_keys_of_the_rows_they_name() -> None:
    stored = ["ad-hoc-1", "gone"]
    assert processed_keys(stored) == []
    pending, kept = sort_out([row("ad-hoc-1", "5"), row("ad-hoc-2", "6")], stored)
    assert [r.id for r in pending] == ["ad-hoc-2"]
    assert kept == ["5:ad-hoc-1"]


@pytest.mark.parametrize("stored", [None, {}, {"processed": None}, "junk"])
def test_no_usable_record_means_nothing_processed(stored: object) -> None:
    assert processed_keys(stored) == []
