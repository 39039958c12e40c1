"""`cdc validate`'s output: a summary table for people, one JSON object for machines."""

from __future__ import annotations

import json
from dataclasses import asdict

from cdc_core.validate import KeyReport, Report, TableReport

KEYS_SHOWN = 20  # per table, in the human form (--json lists up to --max-keys)
_WHY = {
    "differs": "every change the snapshot sees was captured and merged: the mirror is wrong",
    "pending": "changes of this table wait in the lake or in the WAL: maybe lag; run ingest, "
    "then validate again",
    "unverified": "the slot had not confirmed the snapshot's position: a change not yet "
    "captured may explain it",
}
_KINDS = {"missing": "missing in silver", "extra": "extra in silver", "differs": "values differ"}


def to_json(report: Report) -> dict[str, object]:
    data = asdict(report)
    data["equal"] = report.equal
    data["exit_code"] = report.exit_code
    if report.quality is not None:
        data["quality"]["failed"] = len(report.quality.failed)
    return data


def format_json(report: Report) -> str:
    return json.dumps(to_json(report), indent=2, ensure_ascii=False)


def format_report(report: Report) -> str:
    lines = [
        f"validate pipeline {report.pipeline} (env {report.env}), lake {report.lake}",
        f"source snapshot at {report.snapshot_lsn} (REPEATABLE READ); the slot had confirmed "
        f"{report.confirmed_lsn or '(no slot)'}"
        + (f"; {report.rounds} rounds" if report.rounds > 1 else ""),
        "",
        f"{'table':<32} {'source rows':>12} {'silver rows':>12} {'ranges':>7} "
        f"{'mismatching':>11}  verdict",
    ]
    for t in report.tables:
        lines.append(_row(t))
    for t in report.tables:
        lines += _details(t)
    if report.quality is not None:
        q = report.quality
        lines += ["", f"quality (great-expectations): {len(q.outcomes)} expectations on "
                      f"{len(report.tables)} tables, {len(q.failed)} failed ({q.seconds:.1f} s); "
                      f"Data Docs: {q.docs}"]  # fmt: skip
        for o in q.failed:
            where = f"({o.column})" if o.column else ""
            origin = f" [{o.origin}]"
            lines.append(f"  {o.table}: {o.expectation}{where} failed{origin}: {o.detail}")
    verdict = "equal" if report.exit_code == 0 else "NOT equal" if not report.equal else "FAILED"
    lines += ["", f"{verdict}: exit {report.exit_code} ({report.seconds:.1f} s)"]
    return "\n".join(lines)


def _number(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _row(t: TableReport) -> str:
    mismatching = f"{'>=' if not t.exact else ''}{t.mismatching:,}"
    return (f"{t.table:<32} {_number(t.source_rows):>12} {_number(t.silver_rows):>12} "
            f"{t.ranges:>7,} {mismatching:>11}  {t.verdict}")  # fmt: skip


def _details(t: TableReport) -> list[str]:
    out = []
    if t.error:
        out.append(f"{t.table}: {t.error}")
    if t.verdict == "not mirrored":
        out.append(f"{t.table}: no silver mirror yet (nothing captured for it)")
    for note in t.not_compared:
        out.append(f"{t.table}: not compared: {note}")
    if t.keys:
        status = t.keys[0].status
        out.append(f"{t.table}: {t.mismatching:,} differing keys ({status}: {_WHY[status]})")
        if t.pending:
            out.append(f"  not yet in silver version {t.silver_version}: " + "; ".join(t.pending))
        out += [f"  {_key(k)}" for k in t.keys[:KEYS_SHOWN]]
        if t.mismatching > KEYS_SHOWN:
            out.append(f"  ... ({t.mismatching - min(KEYS_SHOWN, len(t.keys)):,} more; --json "
                       "lists up to --max-keys)")  # fmt: skip
    return out


def _key(k: KeyReport) -> str:
    key = ", ".join(f"{n}={v}" for n, v in k.key.items())
    copies = f" (x{k.copies})" if k.copies != 1 else ""
    columns = f": {', '.join(k.columns)}" if k.columns else ""
    return f"{_KINDS[k.kind]:<17} {key}{copies}{columns}"
