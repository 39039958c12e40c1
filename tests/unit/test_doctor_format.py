"""The doctor's report reads as one aligned line per check, fixes under failures, then a count."""

from __future__ import annotations

from cdc_core.pg.doctor import Check, DoctorReport, format_report

REPORT = DoctorReport((
    Check("connect", "pass", "postgresql://cdc:***@db:5432/shop as \"cdc\", database \"shop\""),
    Check("wal_level", "fail", "replica; logical decoding needs logical",
          "ALTER SYSTEM SET wal_level = logical;\nthen restart the server"),
    Check("replication_connection", "skip", "not run: the role cannot replicate"),
    Check('table "Sales"."Order Items"', "fail", "ordinary table; \"cdc\" cannot SELECT it",
          'GRANT SELECT ON "Sales"."Order Items" TO "cdc";'),
))  # fmt: skip


def test_each_check_is_one_aligned_line_with_its_fix_indented_under_it() -> None:
    assert format_report(REPORT).splitlines() == [
        'PASS  connect                      postgresql://cdc:***@db:5432/shop as "cdc", database "shop"',
        "FAIL  wal_level                    replica; logical decoding needs logical",
        "      fix: ALTER SYSTEM SET wal_level = logical;",
        "           then restart the server",
        "SKIP  replication_connection       not run: the role cannot replicate",
        'FAIL  table "Sales"."Order Items"  ordinary table; "cdc" cannot SELECT it',
        '      fix: GRANT SELECT ON "Sales"."Order Items" TO "cdc";',
        "1 passed, 2 failed, 1 not run",
    ]


def test_the_summary_leaves_out_checks_not_run_when_there_are_none() -> None:
    report = DoctorReport(
        (Check("wal_level", "pass", "logical"), Check("encoding", "pass", "UTF8"))
    )

    assert format_report(report).splitlines()[-1] == "2 passed, 0 failed"
    assert report.ok


def test_a_single_failure_makes_the_report_not_ok() -> None:
    assert not REPORT.ok


def test_color_wraps_only_the_status_label() -> None:
    line = format_report(REPORT, color=True).splitlines()[1]

    assert line.startswith("\033[31mFAIL\033[0m  wal_level ")
    assert "\033[" not in line[len("\033[31mFAIL\033[0m") :]


def test_a_very_long_name_pushes_only_its_own_detail() -> None:
    long = "replica_identity " + "x" * 60
    report = DoctorReport((Check("encoding", "pass", "UTF8"), Check(long, "pass", "FULL")))

    first, second, _ = format_report(report).splitlines()
    assert first == "PASS  encoding" + " " * (40 - len("encoding")) + "  UTF8"
    assert second == f"PASS  {long}  FULL"
