"""The doctor's report: one `Check` a line, the `DoctorReport` of them all, and how it prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "warn", "fail", "skip"]  # warn: the run goes on, and says so


@dataclass(frozen=True)
class Check:
    """One line of the report; `fix` (first line: the statement to run) explains a failure."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
    # a run's start stops on this itself, with its own error and bookkeeping (configured tables
    # a publication the product does not add to lacks: `start_publication.unpublished`)
    left_to_start: bool = False
    # what fails it can pass by itself (another process reading the slot now): a run that
    # finds only such failures exits 75, to be retried, not 1
    passing: bool = False


@dataclass(frozen=True)
class DoctorReport:
    """Every check, in the order they ran."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)


_LABELS: dict[Status, str] = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_COLORS: dict[Status, str] = {"pass": "\033[32m", "warn": "\033[33m", "fail": "\033[31m",
                              "skip": "\033[33m"}  # fmt: skip
_NAME_WIDTH = 40  # a longer name (a long table name) pushes its own detail right, not all


def format_report(report: DoctorReport, *, color: bool = False) -> str:
    """One line per check, an indented `fix:` under failures, and a summary line."""
    width = min(max((len(c.name) for c in report.checks), default=0), _NAME_WIDTH)
    lines = []
    for c in report.checks:
        label = f"{_COLORS[c.status]}{_LABELS[c.status]}\033[0m" if color else _LABELS[c.status]
        lines.append(f"{label}  {c.name.ljust(width)}  {c.detail}".rstrip())
        if c.fix:
            first, *rest = c.fix.splitlines()
            lines.append(f"      fix: {first}")
            lines.extend(f"           {line}" for line in rest)
    counts = Counter(c.status for c in report.checks)
    summary = f"{counts['pass']} passed, {counts['fail']} failed"
    if counts["warn"]:
        summary += f", {counts['warn']} warnings"
    if counts["skip"]:
        summary += f", {counts['skip']} not run"
    return "\n".join([*lines, summary])
